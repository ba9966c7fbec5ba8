"""The launcher per distribution, as AmlCompute has it, checked on the launch plan (pure, nothing
started): mpi through the platform's mpirun; pytorch and tensorflow started by each node itself,
with torch's variables or TF_CONFIG per process and no OMPI_*; the dry run shows every process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amlemu.backends.base import NodeRequest
from amlemu.backends.software import node_base_env
from amlemu.cli import cli
from amlemu.runs.launchers import TF_PORT, node_command
from amlemu.runs.plan import AGENT, MPI_AGENT, MPI_AGENT_ARGV, LaunchPlan, plan_launch
from amlemu.specs import Distribution, DistributionType, JobSpec

WS = {"workspace_name": "ws", "subscription_id": "sub", "resource_group": "rg", "location": "local"}
ADDRESSES = ["10.0.0.2", "10.0.0.3"]


def _plan(kind: DistributionType, nodes: int = 2, per_node: int = 2, workers: int | None = None,
          ps: int = 0) -> LaunchPlan:
    job = JobSpec(command="python train.py --lr ${{inputs.lr}}", code=Path("/src"), compute="c1",
                  experiment_name="exp", instance_count=nodes, inputs={"lr": 0.1},
                  distribution=Distribution(kind, per_node, workers, ps))
    requests = [NodeRequest("h", "c1", i, 2, 1 << 30, 2, Path(f"/n{i}"), Path(f"/c{i}")) for i in range(nodes)]
    return plan_launch(job, "run1", "c1", "docker", requests, ADDRESSES[:nodes], WS,
                       base_env=[node_base_env(None)] * nodes, mpi_options=(), as_root=True)


def _seen(plan: LaunchPlan, rank: int) -> dict[str, str]:
    """Everything process `rank` sees: its node's environment, then its own variables."""
    process = plan.processes[rank]
    node = next(n for n in plan.nodes if n.name == process.node)
    return {**plan.node_environment(node), **process.env}


def test_mpi_jobs_are_launched_by_the_platforms_mpirun() -> None:
    plan = _plan(DistributionType.MPI)
    assert plan.launcher == "mpirun" and plan.argv[0] == "mpirun" and plan.processes == ()
    assert plan.argv[-3:] == ("/bin/bash", "-c", "python train.py --lr 0.1")
    assert plan.env["AZ_BATCH_MASTER_NODE"] == "10.0.0.2:6105"
    assert plan.nodes[0].base_env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"  # mpirun runs as root on the nodes


def test_pytorch_jobs_are_started_by_each_node_with_torchs_variables_and_no_mpi() -> None:
    plan = _plan(DistributionType.PYTORCH)
    assert plan.launcher == "node" and plan.argv == ()
    assert [(p.rank, p.node, p.local_rank) for p in plan.processes] == [
        (0, "c1-node-0", 0), (1, "c1-node-0", 1), (2, "c1-node-1", 0), (3, "c1-node-1", 1)]
    for process in plan.processes:
        seen = _seen(plan, process.rank)
        assert (seen["MASTER_ADDR"], seen["MASTER_PORT"], seen["WORLD_SIZE"]) == ("10.0.0.2", "6105", "4")
        assert (seen["RANK"], seen["LOCAL_RANK"]) == (str(process.rank), str(process.local_rank))
        assert seen["NODE_RANK"] == seen["AZUREML_CR_NODE_RANK"] == str(process.rank // 2)
        assert [k for k in seen if k.startswith("OMPI_")] == []
        assert "AZ_BATCH_MASTER_NODE" not in seen and "AZ_BATCHAI_MPI_MASTER_NODE" not in seen
        assert process.argv == ("/bin/bash", "-c", "python train.py --lr 0.1")
        # the host starts it through the launch agent on its node; a docker node's container still
        # has the image's OMPI_* defaults, which the command unsets
        assert process.launch[:2] == (AGENT, process.node)
        assert process.unset == ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def test_the_node_command_runs_the_process_with_its_own_variables(tmp_path: Path) -> None:
    plan = _plan(DistributionType.PYTORCH)
    process = plan.processes[3]
    command = node_command(str(tmp_path), ("/bin/sh", "-c", "pwd; env"), process.env, process.unset)
    container_env = {"PATH": "/usr/bin:/bin", "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    out = subprocess.run(["/bin/sh", "-c", command], env=container_env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == str(tmp_path) and "RANK=3" in out and "LOCAL_RANK=1" in out
    assert [line for line in out if line.startswith("OMPI_")] == []


def test_tensorflow_tasks_get_tf_config_per_process() -> None:
    plan = _plan(DistributionType.TENSORFLOW, workers=3, ps=1)  # 4 tasks, 2 per node
    assert plan.launcher == "node" and [p.node for p in plan.processes] == ["c1-node-0"] * 2 + ["c1-node-1"] * 2
    configs = [json.loads(p.env["TF_CONFIG"]) for p in plan.processes]
    cluster = {"worker": [f"10.0.0.2:{TF_PORT}", f"10.0.0.2:{TF_PORT + 1}", f"10.0.0.3:{TF_PORT + 2}"],
               "ps": [f"10.0.0.3:{TF_PORT + 3}"]}
    assert all(c["cluster"] == cluster and c["environment"] == "cloud" for c in configs)
    assert [c["task"] for c in configs] == [{"type": "worker", "index": 0}, {"type": "worker", "index": 1},
                                            {"type": "worker", "index": 2}, {"type": "ps", "index": 0}]
    for rank in range(4):
        seen = _seen(plan, rank)
        assert not {"RANK", "MASTER_ADDR", "AZ_BATCH_MASTER_NODE"} & set(seen)
        assert [k for k in seen if k.startswith("OMPI_")] == []
    # worker_count defaults to the instance count, parameter_server_count to 0 (az ml's defaults)
    default = _plan(DistributionType.TENSORFLOW)
    assert [json.loads(p.env["TF_CONFIG"])["cluster"] for p in default.processes] == [
        {"worker": [f"10.0.0.2:{TF_PORT}", f"10.0.0.3:{TF_PORT + 1}"]}] * 2


def test_a_single_process_job_is_started_on_its_node_without_mpi() -> None:
    plan = _plan(DistributionType.NONE, nodes=1, per_node=1)
    [only] = plan.processes
    assert plan.launcher == "node" and only.env == {} and only.unset == ()
    assert plan.env["AZ_BATCHAI_MPI_MASTER_NODE"] == "10.0.0.2"


@pytest.mark.parametrize("kind", ["pytorch", "tensorflow"])
def test_the_dry_run_shows_every_process_of_a_node_launched_job(tmp_path: Path, kind: str) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    dist = "  process_count_per_instance: 2\n" if kind == "pytorch" else "  worker_count: 4\n"
    (tmp_path / "job.yml").write_text(f"code: src\ncommand: python train.py\ncompute: azureml:c1\nresources:\n"
                                      f"  instance_count: 2\ndistribution:\n  type: {kind}\n{dist}")
    home = tmp_path / "home"
    home.mkdir()
    runner = CliRunner()
    created = runner.invoke(cli, ["--home", str(home), "compute", "create", "-n", "c1", "--size", "STANDARD_D2_V2",
                                  "--max-instances", "2", "--backend", "process"])
    assert created.exit_code == 0, created.output
    result = runner.invoke(cli, ["--home", str(home), "job", "create", "-f", str(tmp_path / "job.yml"), "--dry-run",
                                 "-o", "json"], env={"AMLEMU_TARGET": ""})
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["launcher"] == "node" and plan["launch"] == []
    assert [(p["rank"], p["node"]) for p in plan["processes"]] == [
        (0, "c1-node-0"), (1, "c1-node-0"), (2, "c1-node-1"), (3, "c1-node-1")]
    assert all(p["argv"] == ["/bin/bash", "-c", "python train.py"] for p in plan["processes"])
    key = "RANK" if kind == "pytorch" else "TF_CONFIG"
    assert all(key in p["env"] for p in plan["processes"])
    assert not [k for k in plan["env"] if k.startswith("OMPI_")]


def test_mpirun_runs_the_agent_on_its_file_without_site() -> None:
    """Once per node on every launch: no site hooks (an editable install's finder alone cost ~15 ms),
    the standard library only (the agent runs as `python -SI agent.py`: an import of amlemu fails)."""
    plan = _plan(DistributionType.MPI)
    assert plan.argv[plan.argv.index("plm_rsh_agent") + 1] == MPI_AGENT == " ".join(MPI_AGENT_ARGV)
    assert MPI_AGENT_ARGV[:2] == (sys.executable, "-SI")
    done = subprocess.run(MPI_AGENT_ARGV, capture_output=True, text=True, env={}, check=False)
    assert (done.returncode, done.stderr) == (2, "usage: amlemu-agent <host> <command...>\n")


def test_the_nodes_kept_from_earlier_runs_are_checked_all_at_once() -> None:
    """A warm submit asks the backend whether each kept node fits the job; on docker each answer is a
    call to the engine, so they are asked side by side (serially, the barrier below would break)."""
    import threading
    from types import SimpleNamespace

    from amlemu.runs import nodework

    asked = threading.Barrier(3, timeout=10)

    def fits(request: SimpleNamespace) -> bool:
        asked.wait()
        return request.name != "n1"

    nodes = [SimpleNamespace(name=f"n{i}") for i in range(3)]
    assert nodework.unfit(SimpleNamespace(fits=fits), nodes) == [nodes[1]]  # type: ignore[arg-type]
    assert nodework.unfit(SimpleNamespace(fits=fits), []) == []  # type: ignore[arg-type]
