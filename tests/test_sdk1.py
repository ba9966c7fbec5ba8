"""SDK v1 (the seed article's API) -> the emulator: ScriptRunConfig / PyTorch estimator -> JobSpec -> v2 YAML.

Each job is read from the run configuration the SDK itself serializes for submission, so these tests
also compare that dry-run output (what the azureml target would send) with the emulator's reading.
"""
from __future__ import annotations

import json
import logging
import shlex
import sys
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import AZUREML_TRAIN

from amlemu.cli import cli
from amlemu.errors import ConfigError
from amlemu.jobs import sdk1
from amlemu.jobs.jobyaml import load_job
from amlemu.specs import ClusterSpec, DataInput, DataMode, Distribution, DistributionType, Priority

with warnings.catch_warnings():  # azureml.data warns about its own enums on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from azureml.core import Environment, ScriptRunConfig  # the dev environment installs the sdk1 extra
    from azureml.core.compute import AmlCompute
    from azureml.core.runconfig import MpiConfiguration, PyTorchConfiguration, TensorflowConfiguration
    from azureml.data.azure_storage_datastore import AzureBlobDatastore

# The SDK's own deprecation noise (ruamel, FileType), raised by the objects these tests build.
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning:azureml"),
              pytest.mark.filterwarnings("ignore::PendingDeprecationWarning:azureml")]
TRAINER = Path(__file__).resolve().parents[1] / "trainer"
MNIST_URI = "azureml://datastores/workspaceblobstore/paths/mnist"


def blobstore(workspace=None) -> AzureBlobDatastore:  # type: ignore[no-untyped-def]
    # The registered default datastore, built offline (Datastore.get would ask the service).
    return AzureBlobDatastore(workspace, "workspaceblobstore", "azureml-blobstore", "devstoreaccount1")


def image_env(**variables: str) -> Environment:
    env = Environment("horovod-env")
    env.docker.base_image = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"
    with sdk1.quiet():  # v1 logs that this place is deprecated; the emulator reads it all the same
        env.environment_variables = dict(variables)
    return env


@pytest.fixture(scope="module")
def seed_estimator():  # type: ignore[no-untyped-def]
    """The seed article's job: azureml.train.dnn.PyTorch, 2 nodes x 1 process, MPI, GPU."""
    with sdk1.quiet():
        from azureml.train.dnn import PyTorch  # noqa: PLC0415 - slow import (~6 s), once per module

        workspace = sdk1.offline_workspace("00000000-0000-0000-0000-000000000000", "rg", "ws")
        target = sdk1.compute_target(workspace, ClusterSpec("gpucluster", "STANDARD_NC6", max_nodes=2,
                                                            vm_priority="lowpriority"))
        estimator = PyTorch(source_directory=str(TRAINER), compute_target=target, entry_script="train.py",
                            script_params={"--data-dir": blobstore(workspace).path("mnist").as_mount(),
                                           "--epochs": 2},
                            node_count=2, process_count_per_node=1, distributed_backend="mpi", use_gpu=True)
    return estimator, target, PyTorch


def test_mpi_script_run_config() -> None:
    src = ScriptRunConfig(source_directory=str(TRAINER), script="train.py", arguments=["--epochs", 3],
                          compute_target="gpucluster", environment=image_env(),
                          distributed_job_config=MpiConfiguration(process_count_per_node=2, node_count=3))
    job = sdk1.job_from_v1(src)
    assert job.command == "python train.py --epochs 3"
    assert (job.code, job.compute, job.experiment_name) == (TRAINER, "gpucluster", "trainer")
    assert job.instance_count == 3
    assert job.distribution == Distribution(DistributionType.MPI, 2)
    assert job.environment == "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"
    assert job.max_run_duration_seconds is None  # v1's 30-day default is "no limit set"
    assert sdk1.job_from_v1(src, compute="other", experiment_name="exp").compute == "other"
    assert sdk1.job_from_v1(src, experiment_name="exp").experiment_name == "exp"


def test_pytorch_configuration_spreads_processes_over_nodes() -> None:
    def job(processes: int):  # type: ignore[no-untyped-def]
        return sdk1.job_from_v1(ScriptRunConfig(
            str(TRAINER), script="train.py", compute_target="gpucluster",
            distributed_job_config=PyTorchConfiguration(process_count=processes, node_count=2)))

    spec = job(4)
    assert (spec.instance_count, spec.distribution) == (2, Distribution(DistributionType.PYTORCH, 2))
    with pytest.raises(ConfigError, match="process_count.*3 processes do not divide over 2 nodes"):
        job(3)


def test_tensorflow_configuration_is_a_tensorflow_distribution() -> None:
    def job(workers: int, ps: int):  # type: ignore[no-untyped-def]
        return sdk1.job_from_v1(ScriptRunConfig(
            str(TRAINER), script="train.py", compute_target="gpucluster",
            distributed_job_config=TensorflowConfiguration(worker_count=workers, parameter_server_count=ps)))

    spec = job(2, 0)  # v1 sets node_count to the worker count
    assert (spec.instance_count, spec.distribution) == (2, Distribution(DistributionType.TENSORFLOW, 1, 2, 0))
    assert spec.process_count == 2
    with pytest.raises(ConfigError, match="4 TensorFlow tasks .* do not divide over 3 instances"):
        job(3, 1)


def test_command_forms() -> None:
    listed = ScriptRunConfig(str(TRAINER), command=["python", "train.py", "--data-dir", "my data", "--epochs", 1],
                             compute_target="gpucluster")
    assert sdk1.job_from_v1(listed).command == "python train.py --data-dir 'my data' --epochs 1"
    text = ScriptRunConfig(str(TRAINER), command="python train.py --epochs 1", compute_target="gpucluster")
    assert sdk1.job_from_v1(text).command == "python train.py --epochs 1"
    both = ScriptRunConfig(str(TRAINER), script="train.py", command="python train.py", compute_target="gpucluster")
    with pytest.raises(ConfigError, match="^command: .*either script= and arguments=, or command="):
        sdk1.job_from_v1(both)


def test_non_string_arguments_reach_the_script_as_v1_passes_them() -> None:
    arguments = ["--epochs", 3, "--lr", 0.05, "--output-dir", "out dir/it's", "--seed", True]
    job = sdk1.job_from_v1(ScriptRunConfig(str(TRAINER), script="train.py", arguments=arguments,
                                           compute_target="gpucluster"))
    assert shlex.split(job.command) == ["python", "train.py", "--epochs", "3", "--lr", "0.05",
                                        "--output-dir", "out dir/it's", "--seed", "True"]


def test_environment_variables_from_both_places_and_timeout() -> None:
    src = ScriptRunConfig(str(TRAINER), script="train.py", compute_target="gpucluster",
                          environment=image_env(FROM_ENV="1", SHARED="environment"), max_run_duration_seconds=3600)
    src.run_config.environment_variables = {"FROM_RUN": "2", "SHARED": "run"}
    job = sdk1.job_from_v1(src)
    assert job.environment_variables == {"FROM_ENV": "1", "FROM_RUN": "2", "SHARED": "run"}
    assert job.max_run_duration_seconds == 3600


def test_registered_environment_without_image() -> None:
    env = Environment("AzureML-ACPT-pytorch-2.2-cuda12.1")
    env.docker.base_image = None
    job = sdk1.job_from_v1(ScriptRunConfig(str(TRAINER), script="train.py", compute_target="c1", environment=env))
    assert job.environment == "azureml:AzureML-ACPT-pytorch-2.2-cuda12.1@latest"


def data_ref_src(*refs, arguments=None) -> ScriptRunConfig:  # type: ignore[no-untyped-def]
    # The documented v1 pattern: str(ref) in the arguments, the reference registered in the run config.
    src = ScriptRunConfig(str(TRAINER), script="train.py", compute_target="gpucluster",
                          arguments=arguments if arguments is not None else ["--data-dir", str(refs[0])])
    src.run_config.data_references = {ref.data_reference_name: ref.to_config() for ref in refs}
    return src


def test_data_reference_argument_becomes_an_input() -> None:
    ref = blobstore().path("mnist").as_mount()
    job = sdk1.job_from_v1(data_ref_src(ref))
    assert job.command == "python train.py --data-dir ${{inputs.data_dir}}"
    assert job.inputs == {"data_dir": DataInput("uri_folder", MNIST_URI, DataMode.RO_MOUNT)}

    named = blobstore().path("/mnist/raw/", data_reference_name="raw").as_download()
    job = sdk1.job_from_v1(data_ref_src(ref, named, arguments=[f"--data-dir={ref}", "--raw", str(named)]))
    assert job.command == "python train.py --data-dir=${{inputs.data_dir}} --raw ${{inputs.raw}}"
    assert job.inputs["raw"] == DataInput("uri_folder", MNIST_URI + "/raw", DataMode.DOWNLOAD)


def test_data_references_that_azure_ml_would_not_resolve() -> None:
    ref = blobstore().path("mnist").as_mount()
    unregistered = ScriptRunConfig(str(TRAINER), script="train.py", compute_target="c1", arguments=["--d", str(ref)])
    with pytest.raises(ConfigError, match=r"^arguments\[1\]: .*not in run_config.data_references.*to_config\(\)"):
        sdk1.job_from_v1(unregistered)

    raw_object = data_ref_src(ref, arguments=["--data-dir", ref])
    with pytest.raises(TypeError, match="not JSON serializable"):  # what the SDK's submit POST would hit
        json.dumps(sdk1.run_config_dict(raw_object))
    with pytest.raises(ConfigError, match=r"^arguments\[1\]: a DataReference object cannot be submitted.*str\(ref\)"):
        sdk1.job_from_v1(raw_object)

    unused = data_ref_src(ref, arguments=["--epochs", 1])
    with pytest.raises(ConfigError, match=r"^run_config.data_references.\w+: is not used in the arguments"):
        sdk1.job_from_v1(unused)


def test_local_target_is_not_a_cluster() -> None:
    src = ScriptRunConfig(str(TRAINER), script="train.py")  # v1's default target: "local"
    with pytest.raises(ConfigError, match="^compute_target: 'local' is not an AmlCompute cluster.*--compute"):
        sdk1.job_from_v1(src)
    assert sdk1.job_from_v1(src, compute="gpucluster").compute == "gpucluster"


@AZUREML_TRAIN
def test_seed_pytorch_estimator(seed_estimator) -> None:  # type: ignore[no-untyped-def]
    estimator, target, PyTorch = seed_estimator
    assert isinstance(target, AmlCompute)
    assert (target.name, target.vm_size, target.vm_priority) == ("gpucluster", "Standard_NC6", "LowPriority")
    assert target.scale_settings.maximum_node_count == 2
    job = sdk1.job_from_v1(estimator, experiment_name="pytorch-horovod")
    assert job.command == "python train.py --data-dir ${{inputs.data_dir}} --epochs 2"
    assert (job.instance_count, job.distribution) == (2, Distribution(DistributionType.MPI, 1))
    assert (job.compute, job.experiment_name, job.code) == ("gpucluster", "pytorch-horovod", TRAINER)
    assert job.inputs == {"data_dir": DataInput("uri_folder", MNIST_URI, DataMode.RO_MOUNT)}
    assert job.environment == "viennaprivate.azurecr.io/pytorch:1.4-gpu"  # the estimator's framework image
    assert job.environment_variables["NCCL_TREE_THRESHOLD"] == "0"
    # Why compute_target() exists: the estimator refuses a cluster name for distributed training.
    with sdk1.quiet(), pytest.raises(Exception, match="should be AmlCompute or KubernetesCompute"):
        PyTorch(source_directory=str(TRAINER), compute_target="gpucluster", entry_script="train.py",
                node_count=2, distributed_backend="mpi")


@AZUREML_TRAIN
def test_serialized_run_config_agrees_with_the_job(seed_estimator) -> None:  # type: ignore[no-untyped-def]
    """The azureml target's dry run (the v1 run configuration it sends) against the emulator's reading."""
    env = image_env(FROM_ENV="1")
    ref = blobstore().path("mnist", data_reference_name="mnist").as_mount()
    src = data_ref_src(ref, arguments=["--data-dir", str(ref), "--epochs", 2])
    src.run_config.environment = env
    src.run_config.node_count = 2
    src.run_config.communicator, src.run_config.mpi = "IntelMpi", MpiConfiguration(process_count_per_node=1)
    src.run_config.environment_variables = {"FROM_RUN": "2"}
    # The input is named after the reference, or after its option when the SDK named it with a GUID.
    for config, input_name in ((src, "mnist"), (seed_estimator[0], "data_dir")):
        rc = sdk1.run_config_dict(config)
        json.dumps(rc)  # it is what the SDK posts
        job = sdk1.job_from_v1(config)
        data_args = {f"$AZUREML_DATAREFERENCE_{n}": "${{inputs.%s}}" % input_name for n in rc["dataReferences"]}
        assert shlex.split(job.command) == ["python", rc["script"], *(data_args.get(a, str(a)) for a in rc["arguments"])]
        assert rc["target"] == job.compute
        assert rc["nodeCount"] == job.instance_count == 2
        assert rc["communicator"] == "IntelMpi" and job.distribution.type is DistributionType.MPI
        assert rc["mpi"]["processCountPerNode"] == job.distribution.process_count_per_instance == 1
        assert {**rc["environment"]["environmentVariables"], **(rc["environmentVariables"] or {})} \
            == job.environment_variables
        (ref_config,) = rc["dataReferences"].values()
        assert job.inputs[input_name].path == \
            f"azureml://datastores/{ref_config['dataStoreName']}/paths/{ref_config['pathOnDataStore']}"


def test_provisioning_configuration_to_cluster() -> None:
    config = AmlCompute.provisioning_configuration(vm_size="STANDARD_NC6", vm_priority="lowpriority", max_nodes=2,
                                                   idle_seconds_before_scaledown=300)
    assert sdk1.cluster_from_v1(config, "gpucluster") == ClusterSpec(
        "gpucluster", "Standard_NC6", Priority.LOW_PRIORITY, 0, 2, 300)
    defaults = sdk1.cluster_from_v1(AmlCompute.provisioning_configuration(max_nodes=4, min_nodes=1), "cpu")
    assert (defaults.vm_size, defaults.vm_priority, defaults.min_nodes, defaults.idle_seconds_before_scaledown) \
        == ("Standard_NC6", Priority.DEDICATED, 1, 1800)


@AZUREML_TRAIN
def test_is_v1(seed_estimator) -> None:  # type: ignore[no-untyped-def]
    assert sdk1.is_v1(seed_estimator[0])
    assert sdk1.is_v1(ScriptRunConfig(str(TRAINER), script="train.py"))
    assert sdk1.is_v1(AmlCompute.provisioning_configuration(max_nodes=1))
    assert not sdk1.is_v1("train.py") and not sdk1.is_v1(ClusterSpec("gpucluster"))


@AZUREML_TRAIN
def test_yaml_round_trips_through_both_loaders(tmp_path: Path, seed_estimator) -> None:  # type: ignore[no-untyped-def]
    from azure.ai.ml import load_job as v2_load_job  # noqa: PLC0415

    ref = blobstore().path("mnist").as_mount()
    src = data_ref_src(ref, arguments=["--data-dir", str(ref), "--epochs", 1])
    src.run_config.environment = image_env(A="1")
    src.run_config.max_run_duration_seconds = 600
    for config in (src, seed_estimator[0]):
        path = tmp_path / "jobs" / "job.yml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(sdk1.yaml_from_v1(config, experiment_name="exp", relative_to=path.parent))
        job = sdk1.job_from_v1(config, experiment_name="exp")
        assert load_job(path) == job
        v2 = v2_load_job(path)
        assert (v2.type, v2.compute, v2.experiment_name) == ("command", "gpucluster", "exp")
        assert Path(path.parent, v2.code).resolve() == TRAINER
        assert v2.command == job.command
        assert v2.inputs["data_dir"].path == MNIST_URI and v2.inputs["data_dir"].mode == "ro_mount"
        assert v2.environment.image == job.environment
        assert dict(v2.environment_variables) == job.environment_variables
    assert v2.resources.instance_count == 2 and v2.distribution.process_count_per_instance == 1
    assert load_job(tmp_path / "jobs" / "job.yml").max_run_duration_seconds is None
    assert sdk1.job_from_v1(src).max_run_duration_seconds == 600


SEED_FILE = """\
from azureml.core import Environment, Experiment, ScriptRunConfig, Workspace
from azureml.core.runconfig import MpiConfiguration
from azureml.data.azure_storage_datastore import AzureBlobDatastore

print("building the configuration")  # must not end up in the YAML on stdout
env = Environment("horovod-env")
env.docker.base_image = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"
data = AzureBlobDatastore(None, "workspaceblobstore", "azureml-blobstore", "acct").path("mnist").as_mount()
src = ScriptRunConfig(source_directory={trainer!r}, script="train.py",
                      arguments=["--data-dir", str(data), "--epochs", 2], compute_target="gpucluster",
                      environment=env,
                      distributed_job_config=MpiConfiguration(process_count_per_node=1, node_count=2))
src.run_config.data_references = {{data.data_reference_name: data.to_config()}}
{extra}
if __name__ == "__main__":
    Experiment(Workspace.from_config(), "pytorch-horovod").submit(src)
"""


def write_seed(tmp_path: Path, extra: str = "") -> Path:
    path = tmp_path / "submit.py"
    path.write_text(SEED_FILE.format(trainer=str(TRAINER), extra=extra))
    return path


def test_cli_job_convert(tmp_path: Path) -> None:
    path = write_seed(tmp_path)
    runner = CliRunner()
    printed = runner.invoke(cli, ["job", "convert", str(path), "--experiment-name", "pytorch-horovod"])
    assert printed.exit_code == 0, printed.output
    assert "building the configuration" not in printed.stdout
    assert "command: python train.py --data-dir ${{inputs.data_dir}} --epochs 2" in printed.stdout
    out = tmp_path / "out" / "job.yml"  # its folder is created
    written = runner.invoke(cli, ["job", "convert", str(path), "--compute", "other", "-o", str(out)])
    assert written.exit_code == 0, written.output
    job = load_job(out)
    assert (job.compute, job.experiment_name, job.instance_count, job.code) == ("other", "trainer", 2, TRAINER)
    assert job.inputs["data_dir"] == DataInput("uri_folder", MNIST_URI, DataMode.RO_MOUNT)

    failed = runner.invoke(cli, ["job", "convert", str(tmp_path / "missing.py")])
    assert failed.exit_code == 1 and failed.output.count("\n") == 1 and "does not exist" in failed.output


def test_file_without_or_with_several_configs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.py"
    empty.write_text("from azureml.core import ScriptRunConfig\nx = 1\n")
    with pytest.raises(ConfigError, match='no ScriptRunConfig or estimator at module level.*if __name__ == "__main__"'):
        sdk1.load_v1_file(empty)
    result = CliRunner().invoke(cli, ["job", "convert", str(empty)])
    assert result.exit_code == 1 and result.output.startswith("amlemu: error: ") and result.output.count("\n") == 1

    two = write_seed(tmp_path, extra="other = ScriptRunConfig('.', script='x.py')")
    with pytest.raises(ConfigError, match="several job configurations: src, other; pass --variable NAME"):
        sdk1.load_v1_file(two)
    assert sdk1.load_v1_file(two, variable="src").script == "train.py"
    with pytest.raises(ConfigError, match="^--variable: 'env' is a Environment"):
        sdk1.load_v1_file(two, variable="env")


def test_module_level_failure_names_the_line(tmp_path: Path) -> None:
    path = write_seed(tmp_path, extra="ws = Workspace.from_config(path='/nonexistent')")
    with pytest.raises(ConfigError, match=rf"^{path}:14: running it failed: .*if __name__ == \"__main__\""):
        sdk1.load_v1_file(path)


def test_missing_sdk_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azureml.core", None)  # `import azureml.core` now fails
    with pytest.raises(ConfigError, match=r"^azureml-core: .*not installed; pip install 'amlemu\[sdk1\]'"):
        sdk1.offline_workspace("sub", "rg", "ws")
    with pytest.raises(ConfigError, match=r"pip install 'amlemu\[sdk1\]'"):
        sdk1.load_v1_file(write_seed(tmp_path))
    assert not sdk1.is_v1(object())  # works without the SDK


def test_quiet_leaves_logging_as_it_was() -> None:
    root = logging.getLogger()
    handlers, filters = list(root.handlers), list(root.filters)
    with sdk1.quiet():
        logging.warning("the SDK's deprecation notice")
    assert root.handlers == handlers and root.filters == filters
