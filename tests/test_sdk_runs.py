"""The SDK objects users already have, run on the emulator: the seed article's v1 estimator trains
MNIST on 2 emulated nodes; the same job as a v1 ScriptRunConfig and as a v2 command() is one run."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import AZUREML_TRAIN, REPO, TRAINING

from amlemu.api import Emulator
from amlemu.jobs import sdk1
from amlemu.specs import ClusterSpec, RunStatus

IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"


def v1_environment():  # type: ignore[no-untyped-def]
    from azureml.core import Environment

    with sdk1.quiet():
        env = Environment("hello-env")
        env.docker.base_image = IMAGE
        env.environment_variables = {}  # v1's default adds EXAMPLE_ENV_VAR; the v2 twin has none
    return env


def _seed_estimator(emu: Emulator):  # type: ignore[no-untyped-def]
    """The seed's code, as written in the article, with an offline workspace and compute target."""
    with sdk1.quiet():  # their imports warn about the SDK's own deprecated enums
        from azureml.data.azure_storage_datastore import AzureBlobDatastore
        from azureml.train.dnn import PyTorch

    ws = emu.workspace()
    workspace = sdk1.offline_workspace(ws["subscription_id"], ws["resource_group"], ws["workspace_name"])
    config = ClusterSpec("gpucluster", "STANDARD_NC6", vm_priority="lowpriority", max_nodes=2,
                         idle_seconds_before_scaledown=0)
    emu.create_compute(config)
    datastore = AzureBlobDatastore(workspace, "workspaceblobstore", "azureml-blobstore", "devstoreaccount1")
    with sdk1.quiet():
        estimator = PyTorch(source_directory=str(REPO / "trainer"),
                            compute_target=sdk1.compute_target(workspace, config),
                            entry_script="train.py",
                            script_params={"--data-dir": datastore.path("mnist").as_mount(), "--epochs": 3},
                            node_count=2, process_count_per_node=1, distributed_backend="mpi", use_gpu=True)
    return estimator


@AZUREML_TRAIN
@pytest.mark.parametrize("backend", ["docker"])  # the v1 reading is backend-blind
def test_the_seed_v1_estimator_is_planned_as_the_seed_job(emu: Emulator, mnist_subset: Path) -> None:
    """`emu.submit(estimator)`'s dry run: the estimator's 2 nodes x 1 process under the platform's
    mpirun, MNIST mounted from workspaceblobstore, the script's arguments; nothing is created. (Its
    training: the seed notebook's test in `make test`, through the service; the next test, here.)"""
    emu.datastores.upload(mnist_subset, "azureml://datastores/workspaceblobstore/paths/mnist")
    plan = emu.plan_job(_seed_estimator(emu))
    assert plan["launch"][0] == "mpirun" and plan["launch"][plan["launch"].index("-np") + 1] == "2"
    assert [r["node"] for r in plan["ranks"]] == ["gpucluster-node-0", "gpucluster-node-1"]
    command = plan["launch"][-1].split()
    assert command[:3] == ["python", "train.py", "--data-dir"] and command[4:] == ["--epochs", "3"]
    assert command[3].endswith("/cap/data-capability/wd/INPUT_data_dir")
    assert emu.runs() == [] and emu.store.nodes("gpucluster") == []


@TRAINING
@pytest.mark.slow
@pytest.mark.full  # the same training runs in `make test` as the seed notebook's (test_seed_notebook.py)
@pytest.mark.parametrize("backend", ["docker"])  # the v1 reading is backend-blind; one training is enough
def test_seed_v1_estimator_trains_on_the_emulator(emu: Emulator, mnist_subset: Path) -> None:
    """On real MNIST in workspaceblobstore (a subset: the figure is tests/test_cluster.py's business)."""
    emu.datastores.upload(mnist_subset, "azureml://datastores/workspaceblobstore/paths/mnist")
    run = emu.submit(_seed_estimator(emu))
    assert run.wait(timeout=600) is RunStatus.COMPLETED, run.summary() + run.logs(0)[-2000:]
    job = run.job
    assert (job.instance_count, job.distribution.process_count_per_instance) == (2, 1)
    assert run.log_path(1).exists(), "no rank 1: the job did not run on 2 processes"
    assert run.metrics()["test_accuracy"] >= 0.6, run.metrics()  # it learned (chance: 0.1): 3 epochs of 2,000 images


def test_same_v1_script_run_config_and_v2_command_are_one_emulator_run(emu: Emulator, tmp_path: Path) -> None:
    from azure.ai.ml import MpiDistribution, command
    from azure.ai.ml.entities import Environment as V2Environment
    from azureml.core import ScriptRunConfig
    from azureml.core.runconfig import MpiConfiguration

    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=0))
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "hello.py").write_text(
        "import os, sys\nprint('rank', os.environ['OMPI_COMM_WORLD_RANK'], 'args', sys.argv[1:], os.environ['GREETING'])\n")
    with sdk1.quiet():
        v1 = ScriptRunConfig(source_directory=str(tmp_path / "src"), script="hello.py", arguments=["--n", 3],
                             compute_target="c1", environment=v1_environment(),
                             distributed_job_config=MpiConfiguration(process_count_per_node=1, node_count=2))
        v1.run_config.environment_variables = {"GREETING": "hi"}
    v2 = command(code=str(tmp_path / "src"), command="python hello.py --n 3", compute="c1", instance_count=2,
                 distribution=MpiDistribution(process_count_per_instance=1), environment=V2Environment(image=IMAGE),
                 environment_variables={"GREETING": "hi"}, experiment_name="src")
    assert sdk1.job_from_v1(v1) == Emulator._job(emu, v2)
    assert emu.plan_job(v1) == emu.plan_job(v2)
    logs = []
    for job in (v1, v2):
        run = emu.submit(job)
        assert run.wait(timeout=180) is RunStatus.COMPLETED, run.summary()
        logs.append(sorted(run.logs(0).splitlines() + run.logs(1).splitlines()))
    assert logs[0] == logs[1] and "rank 1 args ['--n', '3'] hi" in "\n".join(logs[0])
