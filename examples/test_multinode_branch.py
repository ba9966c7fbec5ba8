"""My code takes the multi-node branch of AZ_BATCH_MASTER_NODE on 2 nodes, and not on 1."""
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("launcher.py")


@pytest.mark.aml(nodes=2)
def test_two_nodes_take_the_multi_node_branch(aml_run):
    run = aml_run.script(SCRIPT, nodes=2)
    assert "multi-node: rendezvous at" in run.logs(0) and ":6105 as node 1" in run.logs(1)


@pytest.mark.aml(nodes=1, procs=2)
def test_one_node_takes_the_single_node_branch(aml_run):
    run = aml_run.script(SCRIPT)
    assert run.logs(0).startswith("single node: master") and run.logs(1).startswith("single node")


@pytest.mark.aml(nodes=2, backend="process")
def test_the_same_on_process_nodes_from_a_job_object(aml_run):
    """A job built in Python (the emulator's JobSpec) instead of a YAML file, on process nodes."""
    from amlemu.specs import Distribution, DistributionType, JobSpec

    job = JobSpec(command=f"python {SCRIPT.name}", code=SCRIPT.parent, compute="any", experiment_name="branch",
                  instance_count=2, distribution=Distribution(DistributionType.MPI))
    run = aml_run(job)
    assert "multi-node: rendezvous at 127.0.0.1:6105 as node 1" in run.logs(1)


@pytest.mark.aml(nodes=2, backend="process")
def test_the_same_from_my_azure_ml_sdk_v2_command(aml_run):
    """The job object I send to Azure ML with azure-ai-ml, run here unchanged (compute replaced)."""
    azure_ml = pytest.importorskip("azure.ai.ml", reason="the sdk2 extra is not installed")
    job = azure_ml.command(code=str(SCRIPT.parent), command=f"python {SCRIPT.name}", compute="gpu-cluster",
                           instance_count=2, distribution=azure_ml.MpiDistribution(process_count_per_instance=1),
                           environment="azureml:AzureML-ACPT-pytorch-2.2-cuda12.1@latest")
    run = aml_run(job)
    assert "multi-node: rendezvous at 127.0.0.1:6105 as node 1" in run.logs(1)
