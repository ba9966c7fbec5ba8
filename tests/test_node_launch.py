"""PyTorch and TensorFlow jobs started by each node itself, as AmlCompute starts them (no mpirun),
end to end on both backends: torch's DDP over gloo, TF_CONFIG per process, and the gang semantics
(one failing rank ends the run and the others, cancel stops them all)."""
from __future__ import annotations

import json

import pytest
from conftest import BLOCK, FULL, STARTUP, TRAINING, failing_rank_script, job_processes, wait_until

from amlemu.api import Emulator
from amlemu.specs import RunStatus

pytestmark = pytest.mark.slow

# A tiny DDP training (a linear model on random tensors, a few steps): ranks start from different
# weights, DDP broadcasts rank 0's and averages the gradients, so every rank ends with the same ones.
DDP = """
import json, os
import torch
import torch.distributed as dist

ompi = sorted(k for k in os.environ if k.startswith("OMPI_"))
dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK from the node
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(rank)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(torch.randn(8, 4)), torch.randn(8, 1)).backward()
    opt.step()
flat = torch.cat([p.detach().flatten() for p in model.parameters()])
every = [torch.zeros_like(flat) for _ in range(world)]
dist.all_gather(every, flat)
total = torch.tensor([float(rank)])
dist.all_reduce(total)
keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "AZ_BATCH_MASTER_NODE",
        "AZ_BATCHAI_MPI_MASTER_NODE", "AZ_BATCHAI_JOB_MASTER_NODE_IP", "AZUREML_CR_NODE_RANK")
os.makedirs("outputs", exist_ok=True)
with open(f"outputs/rank-{rank}.json", "w") as fh:
    json.dump({"ompi": ompi, "in_sync": all(torch.equal(e, every[0]) for e in every), "sum": total.item(),
               "env": {k: os.environ.get(k) for k in keys}}, fh)
print(f"rank {rank} of {world} done", flush=True)
dist.destroy_process_group()
"""

TF = """
import json, os, socket
config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
os.makedirs("outputs", exist_ok=True)
with open(f"outputs/{task['type']}-{task['index']}.json", "w") as fh:
    json.dump({"config": config, "host": socket.gethostname(),
               "ompi": sorted(k for k in os.environ if k.startswith("OMPI_"))}, fh)
print("task", task["type"], task["index"], flush=True)
"""


@TRAINING
@pytest.mark.parametrize("backend", ["docker", pytest.param("process", marks=FULL)], indirect=True)
def test_a_pytorch_job_trains_with_ddp_over_gloo_without_mpi(emu: Emulator, cluster, make_job) -> None:
    """On docker nodes (one address each, gloo across the cluster network) in CI: 4 imports of torch
    and of what DDP imports (torch._dynamo) on 2 cores take most of its ~30 s; on process nodes in
    `make test-full` (the variables are checked there in CI by test_cluster's torch-free pytorch job)."""
    cluster()
    run = emu.submit(make_job(DDP, nodes=2, per_node=2, distribution="pytorch"))
    assert run.wait(timeout=300) is RunStatus.COMPLETED, run.record.error  # 2 min seen on a loaded machine
    reports = {int(p.stem.split("-")[1]): json.loads(p.read_text()) for p in run.outputs.glob("rank-*.json")}
    assert sorted(reports) == [0, 1, 2, 3]
    for rank, report in reports.items():
        env = report["env"]
        assert report["ompi"] == [] and report["in_sync"] and report["sum"] == 0 + 1 + 2 + 3
        assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"]) == (str(rank), str(rank % 2), str(rank // 2))
        assert (env["WORLD_SIZE"], env["MASTER_PORT"]) == ("4", "6105")
        assert env["MASTER_ADDR"] == env["AZ_BATCHAI_JOB_MASTER_NODE_IP"] and env["AZUREML_CR_NODE_RANK"] == str(rank // 2)
        assert env["AZ_BATCH_MASTER_NODE"] is None and env["AZ_BATCHAI_MPI_MASTER_NODE"] is None
        assert f"rank {rank} of 4 done" in run.logs(rank)  # user_logs/std_log_process_<rank>.txt
    launched = json.loads((run.dir / "system_logs" / "launch.json").read_text())
    assert launched["launcher"] == "node" and len(launched["processes"]) == 4


def test_a_tensorflow_job_gets_tf_config_per_process(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job(TF, nodes=2, distribution="none",
                   extra="distribution:\n  type: tensorflow\n  worker_count: 3\n  parameter_server_count: 1\n")
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    reports = {p.stem: json.loads(p.read_text()) for p in run.outputs.glob("*.json")}
    assert sorted(reports) == ["ps-0", "worker-0", "worker-1", "worker-2"]
    [cluster_spec] = {json.dumps(r["config"]["cluster"]) for r in reports.values()}  # one view of the cluster
    assert [len(hosts) for hosts in json.loads(cluster_spec).values()] == [3, 1]
    hosts = {name: r["host"] for name, r in reports.items()}
    assert hosts == {"worker-0": "c1-node-0", "worker-1": "c1-node-0", "worker-2": "c1-node-1", "ps-0": "c1-node-1"}
    assert all(r["ompi"] == [] and r["config"]["environment"] == "cloud" for r in reports.values())
    assert "task ps 0" in run.logs(3) and "task worker 0" in run.logs(0)


FAIL = failing_rank_script("RANK")


def test_a_failing_rank_of_a_pytorch_job_fails_the_run_and_stops_the_others(emu: Emulator, cluster,
                                                                            make_job) -> None:
    cluster()
    job = make_job(FAIL, nodes=2, distribution="pytorch")
    run = emu.submit(job)
    assert run.wait(timeout=40) is RunStatus.FAILED
    error = run.record.error
    assert error.startswith("rank 1 on node c1-node-1 failed with exit code 3"), error
    assert "ValueError: rank one gives up" in error and run.record.exit_code == 3
    assert sorted(p.name for p in run.outputs.iterdir()) == ["before-0.txt", "before-1.txt"]
    assert job_processes(job.parent.name) == []
    running_at = next(ts for ts, s, _ in run.events() if s is RunStatus.RUNNING)
    failed_at = next(ts for ts, s, _ in run.events() if s is RunStatus.FAILED)
    assert failed_at - running_at < 10


def test_cancel_stops_every_process_of_a_pytorch_job(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job(BLOCK, nodes=2, per_node=2, distribution="pytorch")
    run = emu.submit(job)
    wait_until(lambda: all("started" in run.logs(rank) for rank in range(4)), STARTUP, "every process started")
    run.cancel()
    assert run.wait(timeout=5) is RunStatus.CANCELED
    assert job_processes(job.parent.name) == []
    assert [s for _, s, _ in run.events()][-2:] == [RunStatus.CANCEL_REQUESTED, RunStatus.CANCELED]
