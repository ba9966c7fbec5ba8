"""One job, two targets: the switch, the azureml dry run (the REST body azure-ai-ml would send)
against the emulator's reading of the same job, SDK v2 objects on the emulator, data sync."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.cli.common import compute_from_dict
from amlemu.errors import ConfigError, TargetError
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.storage.datastores import DatastoreSpec, sync_tree
from amlemu.targets import get_target, resolve_target
from amlemu.targets.azureml import AzureMLTarget, WorkspaceRef, datastore_spec, resolve_workspace

JOB = REPO / "trainer" / "job.yml"
WS = WorkspaceRef("1111-2222", "rg-ml", "ws-ml")
REST_MODES = {"ro_mount": "ReadOnlyMount", "download": "Download", "direct": "Direct",
              "rw_mount": "ReadWriteMount", "upload": "Upload"}


@pytest.fixture
def local_emu(tmp_path: Path):
    emulator = Emulator(home=tmp_path / "home", backend="process")
    emulator.create_compute(compute_from_dict(yaml.safe_load((REPO / "trainer" / "compute.yml").read_text())))
    yield emulator
    emulator.cleanup()


# --- the switch ------------------------------------------------------------------------------------
def test_target_comes_from_flag_then_env_then_project_then_default(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    assert resolve_target(None, {}, project / "src") == ("emulator", "default")
    (project / "pyproject.toml").write_text('[project]\nname = "p"\n[tool.amlemu]\ntarget = "azureml"\n')
    assert resolve_target(None, {}, project / "src")[0] == "azureml"
    assert resolve_target(None, {"AMLEMU_TARGET": "emulator"}, project / "src")[0] == "emulator"
    assert resolve_target("azureml", {"AMLEMU_TARGET": "emulator"}, project) == ("azureml", "--target")
    with pytest.raises(ConfigError, match=r"\$AMLEMU_TARGET: unknown target 'aml'; use one of: emulator, azureml"):
        resolve_target(None, {"AMLEMU_TARGET": "aml"}, project)


def test_workspace_from_environment_pyproject_or_config_json(tmp_path: Path) -> None:
    env = {"AZUREML_ARM_SUBSCRIPTION": "s", "AZUREML_ARM_RESOURCEGROUP": "g", "AZUREML_ARM_WORKSPACE_NAME": "w"}
    assert resolve_workspace(env, tmp_path).arm_path == \
        "/subscriptions/s/resourceGroups/g/providers/Microsoft.MachineLearningServices/workspaces/w"
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    with pytest.raises(TargetError, match="no workspace: write config.json .*AZUREML_ARM_SUBSCRIPTION"):
        resolve_workspace({}, deep)
    (tmp_path / "a" / ".azureml").mkdir()
    (tmp_path / "a" / ".azureml" / "config.json").write_text(json.dumps(
        {"subscription_id": "s2", "resource_group": "g2", "workspace_name": "w2"}))
    found = resolve_workspace({}, deep)
    assert (found.subscription_id, found.workspace_name, found.source) == \
        ("s2", "w2", str(tmp_path / "a" / ".azureml" / "config.json"))
    (deep / "pyproject.toml").write_text('[tool.amlemu.azureml]\nsubscription_id = "s3"\nresource_group = "g3"\n')
    with pytest.raises(ConfigError, match=r"tool.amlemu.azureml.workspace_name: missing"):
        resolve_workspace({}, deep)


# --- the dry runs, compared ---------------------------------------------------------------------
def test_azureml_dry_run_sends_what_the_emulator_runs(local_emu: Emulator) -> None:
    """The REST body azure-ai-ml would PUT and the emulator's plan of the same YAML agree on the
    command, nodes, processes, environment variables and inputs."""
    overrides = ["environment_variables.NCCL_DEBUG=INFO", "inputs.epochs=3"]
    cloud = get_target("azureml", workspace=WS).plan_job(JOB, overrides)
    local = get_target("emulator", emulator=local_emu).plan_job(JOB, overrides)
    body = cloud.data["request"]["body"]["properties"]
    spec = local.payload

    assert cloud.data["request"]["method"] == "PUT"
    assert cloud.data["request"]["path"].startswith(WS.arm_path + "/jobs/")
    assert cloud.data["code_upload"] == str(REPO / "trainer") == str(spec.code)
    assert body["command"] == spec.command
    assert body["computeId"] == spec.compute == local.data["compute"]
    assert body["resources"]["instanceCount"] == len(local.data["nodes"]) == 2
    assert body["distribution"] == {"distributionType": "Mpi", "processCountPerInstance": 1}
    assert len(local.data["ranks"]) == body["resources"]["instanceCount"] * \
        body["distribution"]["processCountPerInstance"]
    assert body["environmentVariables"] == {"NCCL_DEBUG": "INFO"} == spec.environment_variables
    assert local.data["env"]["NCCL_DEBUG"] == "INFO"
    assert body["inputs"]["epochs"] == {"value": "3", "jobInputType": "literal"}
    assert "--epochs 3" in local.data["launch"][-1]
    data = {b["ref"].split(".")[1]: b for b in local.data["data"]}
    assert body["inputs"]["data_dir"] == {"uri": data["data_dir"]["uri"], "jobInputType": data["data_dir"]["type"],
                                          "mode": REST_MODES[data["data_dir"]["mode"]]}
    # The trainer's own environment is registered first, as an anonymous version, then named by the job.
    env = cloud.data["environment_request"]
    assert env["path"].startswith(WS.arm_path + "/environments/CliV2AnonymousEnvironment/versions/")
    assert body["environmentId"] == "azureml:CliV2AnonymousEnvironment:" + env["path"].rsplit("/", 1)[1]
    assert env["body"]["properties"]["image"] == spec.image
    assert "horovod==0.28.1" in env["body"]["properties"]["condaFile"]
    assert body["experimentName"] == spec.experiment_name


def test_compute_dry_run_has_the_provisioning_fields() -> None:
    spec = ClusterSpec("gpucluster", "STANDARD_NC6", vm_priority="lowpriority", max_nodes=2,
                       idle_seconds_before_scaledown=300)
    plan = get_target("azureml", workspace=WS).plan_compute(spec)
    props = plan.data["request"]["body"]["properties"]["properties"]
    assert plan.data["request"]["path"] == f"{WS.arm_path}/computes/gpucluster"
    assert (props["vmSize"], props["vmPriority"]) == ("Standard_NC6", "LowPriority")
    assert props["scaleSettings"] == {"minNodeCount": 0, "maxNodeCount": 2, "nodeIdleTimeBeforeScaleDown": "PT5M"}


def test_cli_switch_sends_the_dry_run_to_azureml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    home = ["--home", str(tmp_path / "home")]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"subscription_id": "s", "resource_group": "g", "workspace_name": "w"}))
    by_env = runner.invoke(cli, [*home, "job", "create", "-f", str(JOB), "--dry-run"], env={"AMLEMU_TARGET": "azureml"})
    assert by_env.exit_code == 0, by_env.output
    plan = json.loads(by_env.stdout)
    assert plan["target"] == "azureml" and plan["workspace"]["workspace_name"] == "w"
    assert plan["request"]["body"]["properties"]["resources"]["instanceCount"] == 2
    by_flag = runner.invoke(cli, [*home, "compute", "create", "-f", str(REPO / "trainer" / "compute.yml"),
                                  "--target", "azureml", "--dry-run"])
    assert by_flag.exit_code == 0, by_flag.output
    assert json.loads(by_flag.stdout)["request"]["path"].endswith("/workspaces/w/computes/gpucluster")
    assert not (tmp_path / "home").exists() or not Emulator(tmp_path / "home").computes()
    (tmp_path / "config.json").unlink()
    missing = runner.invoke(cli, [*home, "job", "create", "-f", str(JOB), "--target", "azureml", "--dry-run"])
    assert missing.exit_code == 1
    assert missing.output.strip().splitlines()[-1].startswith("amlemu: error: azureml target: no workspace: write config.json")


def test_azureml_refuses_what_azure_ml_would_refuse_before_sending(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.py").write_text("print(1)\n")
    (tmp_path / "job.yml").write_text("code: src\ncommand: python t.py\ncompute: azureml:c1\n")

    class NoService(AzureMLTarget):
        def client(self):  # noqa: ANN201 - reaching the service at all would be the bug
            raise AssertionError("the job was sent")

    target = NoService(workspace=WS)
    with pytest.raises(ConfigError, match=r"^environment: missing \(Azure ML would refuse this job\); give environment"):
        target.submit(tmp_path / "job.yml")
    # What only azure-ai-ml's own schema refuses comes out as one line too.
    (tmp_path / "job.yml").write_text("code: src\ncommand: python t.py\ncompute: azureml:c1\nenvironment: azureml:e@latest\n"
                                      "display_name: [1, 2]\n")
    with pytest.raises(ConfigError) as refused:
        target.submit(tmp_path / "job.yml")
    assert "\n" not in str(refused.value) and "display_name" in str(refused.value)


# --- SDK v2 objects on the emulator --------------------------------------------------------------
def test_sdk_v2_command_and_load_job_are_the_same_emulator_job(local_emu: Emulator) -> None:
    from azure.ai.ml import Input, MpiDistribution, command, load_job
    from azure.ai.ml.entities import Environment

    job = command(code=str(REPO / "trainer"), command="python train.py --data-dir ${{inputs.data_dir}} "
                  "--epochs ${{inputs.epochs}}", compute="gpucluster", instance_count=2,
                  distribution=MpiDistribution(process_count_per_instance=1),
                  environment=Environment(image="mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest",
                                          conda_file=str(REPO / "trainer" / "environment.yml")),
                  experiment_name="pytorch-horovod",
                  display_name="horovod-pytorch-mnist",
                  inputs={"data_dir": Input(type="uri_folder", mode="ro_mount",
                                            path="azureml://datastores/workspaceblobstore/paths/mnist"), "epochs": 2})
    from_yaml = local_emu.plan_job(load_job(JOB))
    assert local_emu.plan_job(job) == from_yaml == local_emu.plan_job(JOB)


def test_sdk_v2_objects_run_on_the_emulator(tmp_path: Path) -> None:
    from azure.ai.ml import PyTorchDistribution, command
    from azure.ai.ml.entities import AmlCompute

    emu = Emulator(home=tmp_path / "home", backend="process")
    try:
        emu.create_compute(AmlCompute(name="cpu2", size="STANDARD_D2_V2", max_instances=2,
                                      idle_time_before_scale_down=0))
        assert emu.compute("cpu2").spec == ClusterSpec("cpu2", "Standard_D2_v2", max_nodes=2,
                                                       idle_seconds_before_scaledown=0)
        (tmp_path / "src").mkdir()
        (tmp_path / "src" / "hello.py").write_text(
            "import os\nprint('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], os.environ['GREETING'])\n")
        run = emu.submit(command(code=str(tmp_path / "src"), command="python hello.py", compute="cpu2",
                                 instance_count=2, distribution=PyTorchDistribution(process_count_per_instance=1),
                                 environment_variables={"GREETING": "hi"}, experiment_name="sdk2"))
        assert run.wait(timeout=120) is RunStatus.COMPLETED, run.summary()
        assert "rank 0 of 2 hi" in run.logs(0) and "rank 1 of 2 hi" in run.logs(1)
        assert run.record.experiment == "sdk2"
    finally:
        emu.cleanup()


def test_unknown_objects_and_non_command_jobs_are_refused(local_emu: Emulator) -> None:
    from azure.ai.ml.entities import Environment

    with pytest.raises(ConfigError, match="job: a dict is not a job; give a job YAML path"):
        local_emu.submit({"command": "x"})
    with pytest.raises(ConfigError, match="an azure.ai.ml Environment is not emulated"):
        local_emu.submit(Environment(image="python:3.11"))


# --- data sync -----------------------------------------------------------------------------------
def test_datastore_entity_maps_to_an_adlfs_datastore_without_leaking_the_key() -> None:
    from azure.ai.ml.entities import AccountKeyConfiguration, AzureBlobDatastore, SasTokenConfiguration

    spec, secret = datastore_spec(AzureBlobDatastore(name="workspaceblobstore", account_name="acct",
                                                     container_name="azureml-blobstore-1",
                                                     credentials=AccountKeyConfiguration(account_key="k3y")))
    assert spec == DatastoreSpec("workspaceblobstore", "azure_blob", container="azureml-blobstore-1",
                                 account="acct", credential="account_key") and secret == "k3y"
    spec, secret = datastore_spec(AzureBlobDatastore(name="cn", account_name="acct", container_name="data",
                                                     endpoint="core.chinacloudapi.cn",
                                                     credentials=SasTokenConfiguration(sas_token="sv=1&sig=x")))
    assert (spec.credential, spec.endpoint, secret) == ("sas", "https://acct.blob.core.chinacloudapi.cn", "sv=1&sig=x")
    spec, secret = datastore_spec(AzureBlobDatastore(name="mi", account_name="acct", container_name="data"))
    assert (spec.credential, secret) == ("identity", None)


class AzuriteWorkspace(AzureMLTarget):
    """The real workspace's datastore lookup answered by a second Azurite container (the cloud
    itself cannot run here); everything after the lookup is the real sync path."""

    def __init__(self, endpoint: str, key: str) -> None:
        super().__init__(workspace=WS)
        self.endpoint, self.key = endpoint, key

    def datastore(self, name: str) -> tuple[DatastoreSpec, str | None]:
        return DatastoreSpec(name, "azure_blob", container="real-ws-blobstore", account="devstoreaccount1",
                             credential="account_key", endpoint=self.endpoint), self.key


@pytest.mark.filterwarnings("ignore:Failed to fetch container properties")  # the wrong-key case
def test_data_sync_copies_the_emulator_datastore_and_then_only_changes(tmp_path: Path, mnist_subset: Path) -> None:
    from amlemu.targets.datasync import sync

    emu = Emulator(home=tmp_path / "home", backend="process")
    try:
        uri = "azureml://datastores/workspaceblobstore/paths/mnist-small"
        emu.datastores.upload(mnist_subset, uri)
        server = emu.datastores.azurite.ensure()
        endpoint = server.connection_string.split("BlobEndpoint=")[1].split(";")[0]
        key = server.connection_string.split("AccountKey=")[1].split(";")[0]
        workspace = AzuriteWorkspace(endpoint, key)
        first = sync(emu, workspace, uri)
        local_files = sorted(p for p, _ in emu.datastores.ls(uri))
        assert len(first.copied) == len(local_files) > 0 and first.skipped == []
        assert first.destination == "devstoreaccount1/real-ws-blobstore/mnist-small"
        again = sync(emu, workspace, uri)
        assert again.copied == [] and len(again.skipped) == len(local_files)
        emu.datastores.upload(mnist_subset / "MNIST" / "raw" / "t10k-labels-idx1-ubyte", uri + "/extra")
        assert sync(emu, workspace, uri).copied == ["extra/t10k-labels-idx1-ubyte"]
        with pytest.raises(Exception) as failed:
            sync(emu, AzuriteWorkspace(endpoint, "d3JvbmcK" * 11), uri + "/extra")
        assert "d3JvbmcK" not in str(failed.value) and key not in str(failed.value)
    finally:
        emu.cleanup()


def test_sync_tree_between_local_folders(tmp_path: Path) -> None:
    import fsspec

    fs = fsspec.filesystem("file")
    (tmp_path / "a" / "sub").mkdir(parents=True)
    (tmp_path / "a" / "sub" / "x.bin").write_bytes(b"1234")
    (tmp_path / "b").mkdir()
    copied, skipped = sync_tree((fs, str(tmp_path / "a")), (fs, str(tmp_path / "b")))
    assert (copied, skipped) == (["sub/x.bin"], []) and (tmp_path / "b" / "sub" / "x.bin").read_bytes() == b"1234"
    (tmp_path / "a" / "sub" / "x.bin").write_bytes(b"12345")
    assert sync_tree((fs, str(tmp_path / "a")), (fs, str(tmp_path / "b")))[0] == ["sub/x.bin"]


def test_v1_script_run_config_dry_run_is_the_serialized_run_config(tmp_path: Path) -> None:
    """For SDK v1 the azureml dry run is the run configuration Experiment.submit sends; it and the
    emulator's reading agree on script, arguments, nodes, processes and environment variables."""
    from azureml.core import ScriptRunConfig
    from azureml.core.runconfig import MpiConfiguration

    from amlemu.jobs import sdk1

    with sdk1.quiet():
        src = ScriptRunConfig(source_directory=str(REPO / "trainer"), script="train.py",
                              arguments=["--data-dir", "/data", "--epochs", 2], compute_target="gpucluster",
                              distributed_job_config=MpiConfiguration(process_count_per_node=2, node_count=2))
        src.run_config.environment_variables = {"NCCL_DEBUG": "INFO"}
    plan = get_target("azureml", workspace=WS).plan_job(src)
    config, spec = plan.data["run_config"], sdk1.job_from_v1(src)
    assert plan.data["sdk"] == "azureml-core" and plan.data["call"] == "Experiment(ws, 'trainer').submit(config)"
    assert (config["script"], config["arguments"]) == ("train.py", ["--data-dir", "/data", "--epochs", 2])
    assert spec.command == "python train.py --data-dir /data --epochs 2"
    assert (config["target"], config["nodeCount"], config["mpi"]["processCountPerNode"]) == \
        (spec.compute, spec.instance_count, spec.distribution.process_count_per_instance) == ("gpucluster", 2, 2)
    assert config["environmentVariables"]["NCCL_DEBUG"] == spec.environment_variables["NCCL_DEBUG"] == "INFO"
