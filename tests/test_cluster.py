"""The emulated cluster, end to end, on both backends (one conformance suite, backend as a fixture)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import docker
import psutil
import pytest
from click.testing import CliRunner
from conftest import BLOCK, FULL, REPO, STARTUP, TRAINING, failing_rank_script, job_processes, release, wait_until

from amlemu.api import Emulator
from amlemu.backends import get_backend
from amlemu.cli import cli
from amlemu.cluster.teardown import ours
from amlemu.errors import CapacityError
from amlemu.home import AGENT_CONFIG_VARIABLE
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.jobyaml import load_job
from amlemu.runs.contract import run_folder_id
from amlemu.runs.supervisor import Supervisor
from amlemu.specs import RunStatus

pytestmark = pytest.mark.slow

REPORT = """
import json, os, socket
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "solo"))
keys = [k for k in os.environ if k.startswith(("AZ", "OMPI_", "MASTER_", "WORLD_SIZE", "RANK",
                                               "LOCAL_RANK", "NODE_RANK", "MLFLOW", "OMP_NUM"))]
os.makedirs("outputs", exist_ok=True)
with open(f"outputs/rank-{rank}.json", "w") as fh:
    json.dump({"host": socket.gethostname(), "cwd": os.getcwd(), "env": {k: os.environ[k] for k in keys}}, fh)
print(f"hello from rank {rank} on {socket.gethostname()}", flush=True)
"""



def _reports(run) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {p.stem.removeprefix("rank-"): json.loads(p.read_text()) for p in run.outputs.glob("rank-*.json")}


def test_every_rank_sees_the_amlcompute_contract(emu: Emulator, cluster, make_job) -> None:
    cluster()
    run = emu.submit(make_job(REPORT, nodes=2, per_node=2))
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    reports = _reports(run)
    assert sorted(reports) == ["0", "1", "2", "3"]
    hosts = {rank: r["host"] for rank, r in reports.items()}
    assert hosts == {"0": "c1-node-0", "1": "c1-node-0", "2": "c1-node-1", "3": "c1-node-1"}
    head = emu.store.run(run.id).nodes[0]
    assert head == "c1-node-0"
    for rank, report in reports.items():
        env = report["env"]
        assert report["cwd"] == f"/mnt/azureml/cr/j/{run_folder_id(run.id)}/exe/wd"  # 32 hex, not the name
        assert env["AZUREML_CR_NODE_RANK"] == str(int(rank) // 2) and env["AZ_BATCHAI_CLUSTER_NAME"] == "c1"
        assert env["AZ_BATCHAI_JOB_MASTER_NODE_IP"] == env["AZ_BATCH_MASTER_NODE"].split(":")[0]
        assert env["AZ_BATCH_HOST_LIST"].split(",")[0] == env["AZ_BATCHAI_JOB_MASTER_NODE_IP"]
        assert len(env["AZ_BATCH_HOST_LIST"].split(",")) == 2 and env["AZ_BATCHAI_GPU_COUNT"] == "0"
        assert (env["AZ_BATCH_NODE_ROOT_DIR"], env["AZ_BATCH_NODE_SHARED_DIR"]) == ("/mnt/batch/tasks",
                                                                                "/mnt/batch/tasks/shared")
        assert len(env["AZUREML_WORKSPACE_ID"]) == len(env["AZUREML_EXPERIMENT_ID"]) == 36  # GUIDs
        assert env["MLFLOW_RUN_ID"] == run.id and env["MLFLOW_EXPERIMENT_ID"] == "1"
        assert env["OMPI_COMM_WORLD_SIZE"] == "4" and env["OMPI_COMM_WORLD_RANK"] == rank
        assert env["OMPI_COMM_WORLD_LOCAL_RANK"] == str(int(rank) % 2)
        assert env["AZ_BATCHAI_TASK_INDEX"] == str(int(rank) // 2)
        assert env["AZ_BATCH_MASTER_NODE"].endswith(":6105")
        assert env["AZUREML_RUN_ID"] == run.id and env["AZUREML_ARM_PROJECT_NAME"] == run.record.experiment
    assert len({r["env"]["AZ_BATCH_MASTER_NODE"] for r in reports.values()}) == 1
    for process in range(4):
        assert f"hello from rank {process} on {hosts[str(process)]}" in run.logs(process)
    statuses = [status for _, status, _ in run.events()]
    assert statuses == [RunStatus.NOT_STARTED, RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING,
                        RunStatus.FINALIZING, RunStatus.COMPLETED]


def test_pytorch_distribution_is_started_by_each_node_with_torchs_variables(emu: Emulator, cluster,
                                                                          make_job) -> None:
    """No mpirun, as on AmlCompute: each node starts its processes (runs/launchers.py); they see torch's
    variables and no OMPI_* (tests/test_node_launch.py trains with DDP over them)."""
    cluster()
    run = emu.submit(make_job(REPORT, nodes=2, per_node=2, distribution="pytorch"))
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    reports = _reports(run)
    assert sorted(reports) == ["0", "1", "2", "3"]
    for rank, report in reports.items():
        env = report["env"]
        assert report["host"] == f"c1-node-{int(rank) // 2}" and [k for k in env if k.startswith("OMPI_")] == []
        assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"], env["MASTER_PORT"]) == (
            "4", rank, str(int(rank) % 2), str(int(rank) // 2), "6105")
        assert env["MASTER_ADDR"] == env["AZ_BATCHAI_JOB_MASTER_NODE_IP"] and "AZ_BATCH_MASTER_NODE" not in env
        assert f"hello from rank {rank} on c1-node-{int(rank) // 2}" in run.logs(int(rank))


MLFLOW_JOB = REPORT + """
import mlflow
with mlflow.start_run() as active:  # attaches to the job's run (MLFLOW_RUN_ID), as on Azure ML
    mlflow.log_metric("loss", 0.5, step=1)
print("mlflow run", active.info.run_id, flush=True)
"""


def test_a_single_node_job_runs_without_mpi(emu: Emulator, cluster, make_job) -> None:
    cluster()
    run = emu.submit(make_job(MLFLOW_JOB, distribution="none"))
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    env = _reports(run)["solo"]["env"]
    assert "OMPI_COMM_WORLD_RANK" not in env and "AZ_BATCHAI_MPI_MASTER_NODE" in env
    assert env["AZUREML_CR_NODE_RANK"] == "0" and env["AZ_BATCH_HOST_LIST"] == env["AZ_BATCHAI_JOB_MASTER_NODE_IP"]
    # one node, one process: Azure ML's user_logs/std_log.txt, found by whatever reads rank 0's log
    logs = sorted(p.name for p in (run.dir / "user_logs").iterdir())
    assert logs == ["std_log.txt"] and run.log_path(0).name == "std_log.txt"
    assert "hello from rank solo on c1-node-0" in run.logs(0)
    assert f"mlflow run {run.id}" in run.logs(0)
    assert run.metric_history()["loss"] == [(1, 0.5)]  # one run in the record: the seeded one, used


SHM = """
import os
fs = os.statvfs("/dev/shm")
print("shm bytes", fs.f_blocks * fs.f_frsize, flush=True)
"""


def test_resources_shm_size_sizes_dev_shm_with_azure_mls_default_of_2g(emu: Emulator, cluster, make_job,
                                                                       backend: str) -> None:
    cluster(max_nodes=1, idle_seconds_before_scaledown=600)  # the second job reuses the node
    default = emu.submit(make_job(SHM, distribution="none"))
    assert default.wait(timeout=120) is RunStatus.COMPLETED, default.record.error
    assert "shm bytes 2147483648" in default.logs(0)
    sized = make_job(SHM, distribution="none")
    sized.write_text(sized.read_text().replace("resources:\n", "resources:\n  shm_size: 256m\n"))
    run = emu.submit(sized)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    assert "shm bytes 268435456" in run.logs(0)
    assert emu.store.run(run.id).nodes == emu.store.run(default.id).nodes == ["c1-node-0"]
    remade = "node c1-node-0 is made again for this job (its /dev/shm size"
    # docker sizes /dev/shm as it creates a container; a process node's sandbox is new at each launch
    assert (remade in (run.dir / "system_logs" / "lifecycle.txt").read_text()) == (backend == "docker")


def test_a_failing_rank_fails_the_run_and_stops_the_others(emu: Emulator, cluster, make_job) -> None:
    cluster()
    script = failing_rank_script("OMPI_COMM_WORLD_RANK")
    job = make_job(script, nodes=2)
    run = emu.submit(job)
    assert run.wait(timeout=40) is RunStatus.FAILED
    error = run.record.error
    assert error.startswith("rank 1 on node c1-node-1 failed with exit code 3"), error
    assert "ValueError: rank one gives up" in error
    assert sorted(p.name for p in run.outputs.iterdir()) == ["before-0.txt", "before-1.txt"]
    assert job_processes(job.parent.name) == []
    running_at = next(ts for ts, s, _ in run.events() if s is RunStatus.RUNNING)
    failed_at = next(ts for ts, s, _ in run.events() if s is RunStatus.FAILED)
    assert failed_at - running_at < 10


def test_a_job_past_its_time_limit_is_stopped(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job("import time\nprint('working', flush=True)\ntime.sleep(300)\n", nodes=2,
                   extra="limits:\n  timeout: 2\n")
    run = emu.submit(job)
    assert run.wait(timeout=30) is RunStatus.FAILED
    assert run.record.error == "exceeded max_run_duration_seconds=2"
    assert job_processes(job.parent.name) == []


def test_cancel_while_running_stops_every_rank_within_5_seconds(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job(BLOCK, nodes=2)
    run = emu.submit(job)
    wait_until(lambda: "started" in run.logs(0) and "started" in run.logs(1), STARTUP, "both ranks started")
    run.cancel()
    assert run.wait(timeout=5) is RunStatus.CANCELED
    assert job_processes(job.parent.name) == []
    assert [s for _, s, _ in run.events()][-2:] == [RunStatus.CANCEL_REQUESTED, RunStatus.CANCELED]


def test_jobs_queue_for_nodes_in_order_and_use_their_snapshot(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=2)
    first = emu.submit(make_job(BLOCK, nodes=2))
    wait_until(lambda: first.status is RunStatus.RUNNING, STARTUP, "the first job runs")
    job = make_job("print('version 1', flush=True)\n", nodes=2)
    second = emu.submit(job)
    third = emu.submit(make_job("print('third', flush=True)\n", nodes=1))
    script = next(job.parent.glob("src/*.py"))
    script.write_text("print('version 2', flush=True)\n")  # edited after submit: must not matter
    wait_until(lambda: second.status is RunStatus.QUEUED and third.status is RunStatus.QUEUED, 5, "queued")
    third.cancel()
    assert third.wait(timeout=10) is RunStatus.CANCELED
    release(emu, first)
    assert first.wait(timeout=60) is RunStatus.COMPLETED
    assert second.wait(timeout=60) is RunStatus.COMPLETED, second.record.error
    assert "version 1" in second.logs(0) and "version 2" not in second.logs(0)
    first_done = first.events()[-1][0]
    second_preparing = next(ts for ts, s, _ in second.events() if s is RunStatus.PREPARING)
    assert second_preparing >= first_done - 0.5  # it waited for the nodes the first job held


def test_more_nodes_than_max_nodes_is_refused_at_submit(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=2)
    with pytest.raises(CapacityError, match="resources.instance_count: 3 nodes exceed max_instances 2 of compute 'c1'"):
        emu.submit(make_job(REPORT, nodes=3))
    assert emu.runs() == []


def test_idle_nodes_scale_down_to_min_nodes(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=2, min_nodes=1, idle_seconds_before_scaledown=1)
    assert [n.state for n in emu.store.nodes("c1")] == ["idle"]
    run = emu.submit(make_job(REPORT, nodes=2))
    assert run.wait(timeout=60) is RunStatus.COMPLETED
    wait_until(lambda: len(emu.store.nodes("c1")) == 1, 15, "the extra node scaled down")
    wait_until(lambda: len(emu_nodes(emu)) == 1, 15, "the backend holds one node")


def emu_nodes(emu: Emulator):  # type: ignore[no-untyped-def]
    return get_backend(emu.compute("c1").backend, emu.home).list_nodes()


def test_dry_run_returns_the_plan_and_creates_nothing(emu: Emulator, cluster, make_job) -> None:
    cluster()
    plan = emu.plan_job(make_job(REPORT, nodes=2))
    # Process nodes' mpirun runs in their cluster's network namespace (root here, as in CI).
    network = ["/usr/bin/nsenter", f"--net=/run/amlemu/netns/{emu.home.id}/c1", "--"]
    prefix = network if emu.default_backend == "process" else []
    assert plan["launch"][:len(prefix) + 1] == [*prefix, "mpirun"] and plan["ranks"][1]["node"] == "c1-node-1"
    assert [n["hostname"] for n in plan["nodes"]] == ["c1-node-0", "c1-node-1"]
    assert plan["env"]["AZ_BATCH_MASTER_NODE"] == "<address of c1-node-0>:6105"
    cache = {"bind": "/mnt/amlemu/cache", "mode": "ro"} if emu.default_backend == "docker" else None
    assert cache is None or plan["nodes"][0]["volumes"][str(emu.home.cache_dir("c1", "c1-node-0") / "data")] == cache
    assert emu.runs() == [] and emu.store.nodes("c1") == [] and emu_nodes(emu) == []


# `make test` runs the seed's job on process nodes through test_faults' preemption (its contract and
# data reads are checked there) and on docker nodes through the seed notebook: both here are `full`.
@TRAINING
@pytest.mark.parametrize("backend", [pytest.param("process", marks=FULL), pytest.param("docker", marks=FULL)])
def test_horovod_mnist_on_two_emulated_nodes(emu: Emulator, cluster, backend: str, request: pytest.FixtureRequest) -> None:
    """The seed's job, unchanged, on real MNIST read from workspaceblobstore (Azurite) through each
    node's own cache: 2 nodes x 1 process. On the seed's docker nodes the full set reaching 95%
    (the proof of the figure, `make test-full`); on process nodes 2,000 images showing it learns
    (the same path, minus the figure), with the trainer's own contract: rank 0 alone logs, the
    loss every --log-interval steps, the parameters identical on both ranks."""
    data, bar = (request.getfixturevalue("mnist_root"), 0.95) if backend == "docker" else \
        (request.getfixturevalue("mnist_subset"), 0.5)  # 2 epochs of 2,000 images: ~0.58 (chance: 0.1)
    cluster()
    emu.datastores.upload(data, "azureml://datastores/workspaceblobstore/paths/mnist")
    run = emu.submit(REPO / "trainer" / "job.yml", overrides=["compute=c1"])
    assert run.wait(timeout=600) is RunStatus.COMPLETED, run.record.error
    images = data / "MNIST" / "raw" / "train-images-idx3-ubyte"
    for node in ("c1-node-0", "c1-node-1"):  # each node's data runtime mount fetched the images itself
        rslex = "".join(p.read_text() for p in (run.dir / "system_logs" / "data_capability" / node).glob("rslex.log.*"))
        assert f"opened /MNIST/raw/train-images-idx3-ubyte ({images.stat().st_size} bytes, whole file)" in rslex
    summary = json.loads((run.outputs / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["params_in_sync"] is True and summary["resumed_from"] is None
    assert "parameters identical on all 2 ranks: True" in run.logs(0)
    metrics = run.metrics()
    assert metrics["test_accuracy"] >= bar and metrics["test_accuracy"] == pytest.approx(summary["test_accuracy"])
    history = run.metric_history()
    assert [step for step, _ in history["test_accuracy"]] == [1, 2]
    per_epoch = summary["global_step"] // 2  # --log-interval 10: batches 0, 10, ... of each epoch
    assert [step for step, _ in history["train_loss"]] == [e * per_epoch + b + 1 for e in (0, 1) for b in range(0, per_epoch, 10)]
    assert {"model.pt", "checkpoint-epoch1.pt", "checkpoint-epoch2.pt"} <= {p.name for p in run.outputs.iterdir()}


def test_cancel_while_preparing_never_starts_the_job(emu: Emulator, cluster, make_job) -> None:
    """Driven step by step in this process: Preparing is too short to hit from outside reliably."""
    cluster()
    job = make_job("print('ran', flush=True)\n", nodes=2)
    run_id = "prep_cancel_1"
    spec = load_job(job)
    shutil.copytree(spec.code, emu.home.run_dir(run_id) / "snapshot")
    emu.store.add_run(run_id, spec.experiment_name, "c1", job_to_record(spec))
    emu.store.set_status(run_id, RunStatus.QUEUED)
    supervisor = Supervisor(emu.home, run_id)
    allocation = supervisor.wait_for_nodes()
    assert emu.run(run_id).status is RunStatus.PREPARING
    emu.run(run_id).cancel()
    assert supervisor.prepare(allocation) is None
    supervisor.logs.close()
    run = emu.run(run_id)
    assert run.status is RunStatus.CANCELED
    assert RunStatus.RUNNING not in [s for _, s, _ in run.events()] and run.logs(0) == ""
    assert [n.state for n in emu.store.nodes("c1")] == ["idle", "idle"]


KEEPS_OUTPUTS = """
import os, socket, sys, time
os.makedirs("outputs", exist_ok=True)
with open(os.path.join(sys.argv[1], f"{socket.gethostname()}.bin"), "w") as out:
    out.write("bound to a datastore")
with open(f"outputs/{socket.gethostname()}.txt", "w") as out:
    out.write("written before the supervisor died")
with open(f"logs/{socket.gethostname()}.log", "w") as out:
    out.write("the job's own log")
print("started", flush=True)
while True:
    time.sleep(0.2)
"""


def test_a_dead_supervisors_run_is_recovered_at_once_keeping_its_outputs(emu: Emulator, cluster, make_job) -> None:
    """SIGKILL of a run's supervisor: its watchdog, with no CLI call, stops the job, collects both
    nodes' ./outputs and ./logs into the run's record, uploads its datastore-bound output, removes
    the nodes and fails the run with the supervisor's last words; then nothing of the run is left."""
    cluster()
    model = f"azureml://datastores/workspaceblobstore/paths/killed/{uuid.uuid4().hex[:8]}"
    job = make_job(KEEPS_OUTPUTS, nodes=2, extra=f"outputs:\n  model: {{path: {model}, mode: upload}}\n",
                   args="${{outputs.model}}")
    run = emu.submit(job)
    wait_until(lambda: "started" in run.logs(0) and "started" in run.logs(1), STARTUP, "both ranks started")
    with open(run.dir / "system_logs" / "supervisor.txt", "a") as log:  # what a crash would have printed last
        log.write("Traceback (most recent call last):\n  ...\nRuntimeError: stands for a crash\n\n")
    os.kill(run.record.supervisor_pid, signal.SIGKILL)  # the emulator itself dies mid-run
    # The store is read directly: Run.wait or a CLI call would reconcile (the slower way this was noticed).
    wait_until(lambda: emu.store.run(run.id).status is RunStatus.FAILED, 60, "the watchdog failed the run")
    assert run.record.error == ("the emulator process supervising this run died; the run was stopped and "
                                "its nodes removed (its last words: RuntimeError: stands for a crash)")
    for node in ("c1-node-0", "c1-node-1"):
        assert (run.outputs / f"{node}.txt").read_text() == "written before the supervisor died"
        assert (run.dir / "logs" / f"{node}.log").read_text() == "the job's own log"
    assert sorted(path for path, _ in emu.datastores.ls(model)) == [f"{model.split('/paths/')[1]}/{node}.bin"
                                                                     for node in ("c1-node-0", "c1-node-1")]
    assert job_processes(job.parent.name) == []
    assert emu.store.nodes("c1") == [] and emu_nodes(emu) == []  # nobody is left to scale them down
    wait_until(lambda: not [p for p in psutil.process_iter(["cmdline"]) if run.id in (p.info["cmdline"] or [])],
               10, "the watchdog exited")
    shown = CliRunner().invoke(cli, ["--home", str(emu.home.root), "job", "show", run.id, "-o", "json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["status"] == "Failed", shown.output


def test_cleanup_knows_a_runs_mpirun_by_its_agent_config(tmp_path: Path) -> None:
    """mpirun's argv names the run's folder by a hash, so a launch left by a dead supervisor is
    known by the launch agent's configuration its environment names; a process reusing the pid has none."""
    run_id = "brave_apple_0123456789"
    env = {**os.environ, AGENT_CONFIG_VARIABLE: str(tmp_path / "runs" / run_id / "agent-config.marshal")}
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env) as launch, \
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as stranger:
        try:
            assert ours(launch.pid, run_id) and not ours(launch.pid, "brave_apple")
            assert not ours(stranger.pid, run_id)
        finally:
            launch.kill()
            stranger.kill()


def test_a_supervisor_just_started_is_known_as_the_runs_own() -> None:
    """Right after Popen returns, a process's argv can still be empty (the kernel sets it after it
    closed the pipe Popen waits on): a supervisor just submitted was taken for a dead one under load,
    and its run failed as "supervisor died" while it ran (3 of 300 starts when idle)."""
    run_id = "keen_lamp_0123456789"
    for _ in range(400):  # without the wait for the argv, this failed 2 runs in 3
        with subprocess.Popen(["/bin/sh", "-c", "sleep 30", run_id], start_new_session=True) as started:
            try:
                assert ours(started.pid, run_id)
            finally:
                started.kill()


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_a_node_killed_from_outside_fails_the_run(emu: Emulator, cluster, make_job) -> None:
    cluster(idle_seconds_before_scaledown=600)  # the healthy node stays, idle (at 0 it may be gone already)
    job = make_job(BLOCK, nodes=2)
    run = emu.submit(job)
    wait_until(lambda: "started" in run.logs(0) and "started" in run.logs(1), STARTUP, "both ranks started")
    killed_at = time.monotonic()
    docker.from_env().containers.get(f"amlemu-{emu.home.id}-c1-node-1").kill()
    assert run.wait(timeout=30) is RunStatus.FAILED
    assert time.monotonic() - killed_at < 10
    assert run.record.error.startswith("node c1-node-1 was lost (its container or processes stopped)"), run.record.error
    assert job_processes(job.parent.name) == []
    assert [n.name for n in emu.store.nodes("c1")] == ["c1-node-0"]  # the lost node is gone for good
