"""The CLI v2 job YAML: the seed's job loads, bad input is refused with the field named."""
from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO

from amlemu.api import Emulator
from amlemu.errors import ConfigError
from amlemu.jobs.jobspec_io import job_from_record, job_to_record
from amlemu.jobs.jobyaml import apply_overrides, job_from_dict, load_job, script_of
from amlemu.runs.contract import resolve_command, run_folder_id
from amlemu.specs import ClusterSpec, DataInput, DataMode, DistributionType

SEED_JOB = REPO / "trainer" / "job.yml"


def test_the_seed_job_loads_with_its_data_path_overridden(mnist_subset: Path) -> None:
    job = load_job(SEED_JOB, [f"inputs.data_dir.path={mnist_subset}"])
    assert job.code == REPO / "trainer" and job.compute == "gpucluster"
    assert job.experiment_name == "pytorch-horovod"
    assert (job.instance_count, job.distribution.type, job.distribution.process_count_per_instance) == (
        2, DistributionType.MPI, 1)
    assert job.inputs["data_dir"] == DataInput("uri_folder", str(mnist_subset), DataMode.RO_MOUNT)
    # Its own environment (no curated one has Horovod): Azure ML's Open MPI image and the trainer's conda file.
    assert job.image == "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest"
    assert "horovod==0.28.1" in job.environment_def["conda_file"]["dependencies"][-1]["pip"]
    assert resolve_command(job, "r1") == ("python train.py --data-dir "
                                          f"/mnt/azureml/cr/j/{run_folder_id('r1')}/cap/data-capability/wd/INPUT_data_dir --epochs 2")


def test_shm_size_is_read_kept_with_the_run_and_defaults_to_azure_mls_2g(tmp_path: Path) -> None:
    job = load_job(_write(tmp_path, BASE + "resources:\n  shm_size: 512m\n"))
    assert (job.shm_size, job.shm_bytes) == ("512m", 512 << 20)
    assert job_from_record(job_to_record(job)) == job
    assert load_job(_write(tmp_path, BASE)).shm_bytes == 2 << 30  # azureml-core's _DEFAULT_SHM_SIZE


def test_the_seed_job_reads_mnist_from_workspaceblobstore() -> None:
    job = load_job(SEED_JOB)
    assert job.inputs["data_dir"] == DataInput("uri_folder", "azureml://datastores/workspaceblobstore/paths/mnist",
                                               DataMode.RO_MOUNT)
    assert resolve_command(job, "r1") == ("python train.py --data-dir "
                                          f"/mnt/azureml/cr/j/{run_folder_id('r1')}/cap/data-capability/wd/INPUT_data_dir --epochs 2")


def _write(tmp_path: Path, text: str, script: str | None = "train.py") -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    if script:
        (tmp_path / "src" / script).write_text("print('hi')\n")
    path = tmp_path / "job.yml"
    path.write_text(text)
    return path


BASE = "code: src\ncommand: python train.py\ncompute: azureml:c1\n"


@pytest.mark.parametrize(("text", "message"), [
    (BASE + "bogus: 1\n", "bogus: unknown field; known fields:"),
    (BASE + "resources:\n  instance_count: -2\n", "resources.instance_count: must be at least 1, got -2"),
    (BASE + "resources:\n  instance_count: two\n", "resources.instance_count: must be an integer, got 'two'"),
    (BASE + "resources:\n  instance_count: 2\n", "distribution: instance_count 2 needs a distribution"),
    (BASE + "distribution:\n  type: ray\n", "distribution.type: 'ray' is not supported; use mpi, pytorch or tensorflow"),
    (BASE + "distribution:\n  type: tensorflow\n  process_count_per_instance: 2\n",
     "distribution.process_count_per_instance: is not a field of a tensorflow distribution"),
    (BASE + "distribution:\n  type: pytorch\n  worker_count: 2\n",
     "distribution.worker_count: is not a field of a pytorch distribution"),
    (BASE + "resources:\n  instance_count: 2\ndistribution:\n  type: tensorflow\n  worker_count: 3\n",
     "distribution.worker_count: 3 TensorFlow tasks (workers and parameter servers) do not divide over 2 instances"),
    (BASE + "distribution:\n  type: tensorflow\n  parameter_server_count: -1\n",
     "distribution.parameter_server_count: must be 0 or more, got -1"),
    (BASE + "distribution:\n  type: mpi\n  process_count_per_instance: 0\n",
     "distribution.process_count_per_instance: must be at least 1, got 0"),
    (BASE + "distribution:\n  type: mpi\n  processes: 2\n", "distribution.processes: unknown field"),
    ("code: src\ncommand: python train.py\ncompute: [c1]\n", "compute: ['c1'] is not a compute name; write compute: "
     "azureml:<cluster name>, or leave it out for serverless compute"),
    ("code: nowhere\ncommand: python train.py\ncompute: c1\n", "code: "),
    ("code: src\ncommand: python missing.py\ncompute: c1\n", "command: script missing.py not found in code folder"),
    ("code: src\ncompute: c1\n", "command: missing"),
    (BASE.replace("train.py", "train.py ${{inputs.lr}}"), "command: ${{inputs.lr}} refers to nothing"),
    (BASE + "type: sweep\n", "type: a sweep job where a command job is expected"),
    (BASE + "limits:\n  timeout: 0\n", "limits.timeout: must be a positive number of seconds, got 0"),
    (BASE + "resources:\n  shm_size: 0g\n", "resources.shm_size: '0g' is not a size; write a number greater than 0"),
    (BASE + "resources:\n  shm_size: 2 GB\n", "resources.shm_size: '2 GB' is not a size"),
    (BASE + "inputs:\n  d:\n    type: uri_folder\n    path: ./nothing\n", "inputs.d.path: "),
    (BASE + "inputs:\n  d:\n    type: uri_folder\n    path: src\n    mode: eval_mount\n",
     "inputs.d.mode: 'eval_mount' is not a data mode; use one of: ro_mount, download, direct"),
    (BASE + "inputs:\n  d:\n    path: src\n    mode: rw_mount\n",
     "inputs.d.mode: rw_mount is not allowed here; use one of: ro_mount, download, direct"),
    (BASE + "inputs:\n  d:\n    path: src\n    mode: direct\n", "inputs.d.mode: direct passes a storage URI"),
    (BASE + "inputs:\n  d:\n    path: azureml://datastores/ws/mnist\n",
     "inputs.d.path: 'azureml://datastores/ws/mnist' is not a datastore URI; write azureml://datastores/<datastore>/paths/<path>"),
    (BASE + "inputs:\n  d:\n    path: azureml://datastores/ws/paths/a/../../etc\n",
     "inputs.d.path: 'a/../../etc' contains '..'; datastore paths cannot leave the datastore"),
    (BASE + "inputs:\n  d:\n    path: https://acct.blob.core.windows.net/c/x?sig=1\n",
     "inputs.d.path: https://acct.blob.core.windows.net/c/x?sig=1: a URL with a query or a fragment (a SAS token) is not read"),
    (BASE + "outputs:\n  o:\n    mode: ro_mount\n", "outputs.o.mode: ro_mount is not allowed here; use one of: rw_mount, upload, direct"),
    (BASE + "outputs:\n  o:\n    path: ./out\n", "outputs.o.path: './out' is not a datastore URI"),
    (BASE.replace("train.py", "train.py ${{outputs.o}}"), "command: ${{outputs.o}} refers to nothing"),
    (BASE + "environment_variables:\n  DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: 2min\n",
     "environment_variables.DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: '2min' is not a number of milliseconds"),
    (BASE + "environment_variables:\n  DATASET_MOUNT_CACHE_SIZE: lots\n",
     "environment_variables.DATASET_MOUNT_CACHE_SIZE: 'lots' is not a size"),
])
def test_bad_jobs_name_the_field(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_job(_write(tmp_path, text))
    assert str(err.value).startswith(message), str(err.value)
    assert "\n" not in str(err.value)


def test_yaml_syntax_errors_give_the_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"job.yml: YAML syntax error at line 3, column \d+"):
        load_job(_write(tmp_path, "code: src\ncommand: [python\ncompute: c1\n"))


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^-f: .*absent.yml does not exist"):
        load_job(tmp_path / "absent.yml")


def test_literal_inputs_environment_and_limits(tmp_path: Path) -> None:
    job = load_job(_write(tmp_path, BASE.replace("train.py", "train.py --lr ${{inputs.lr}}") +
                          "inputs:\n  lr: 0.5\nenvironment_variables:\n  A: 1\nlimits:\n  timeout: 30\n"
                          "environment:\n  image: my/image:1\nexperiment_name: exp\n"))
    assert resolve_command(job, "r") == "python train.py --lr 0.5"
    assert job.environment_variables == {"A": "1"} and job.max_run_duration_seconds == 30
    assert job.image == "my/image:1" and job.experiment_name == "exp"


def test_experiment_defaults_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Azure ML's rule: the folder the job is created from names it, not the code folder (src)."""
    (tmp_path / "my-work").mkdir()
    monkeypatch.chdir(tmp_path / "my-work")
    assert load_job(_write(tmp_path, BASE)).experiment_name == "my-work"


def test_uri_file_input_resolves_to_the_file(tmp_path: Path) -> None:
    job = load_job(_write(tmp_path, BASE.replace("train.py", "train.py ${{inputs.f}}") +
                          "inputs:\n  f:\n    type: uri_file\n    path: src/train.py\n    mode: download\n"))
    assert resolve_command(job, "r").endswith("/cap/data-capability/wd/INPUT_f/train.py")


def test_overrides_set_nested_fields_and_refuse_nonsense() -> None:
    data = {"inputs": {"d": {"path": "a"}}, "resources": {"instance_count": 1}}
    apply_overrides(data, ["inputs.d.path=/x", "resources.instance_count=3", "limits.timeout=9"])
    assert data == {"inputs": {"d": {"path": "/x"}}, "resources": {"instance_count": 3}, "limits": {"timeout": 9}}
    with pytest.raises(ConfigError, match="^--set: 'nope' is not key=value"):
        apply_overrides({}, ["nope"])
    with pytest.raises(ConfigError, match="^--set resources.instance_count.x: instance_count holds a value"):
        apply_overrides(data, ["resources.instance_count.x=1"])


@pytest.mark.parametrize(("command", "script"), [
    ("python train.py --x 1", "train.py"), ("python -u sub/t.py", "sub/t.py"), ("python3 -m pkg", None),
    ("bash run.sh", None), ("python -c 'print(1)'", None),
])
def test_script_of(command: str, script: str | None) -> None:
    assert script_of(command) == script


def test_datastore_inputs_and_outputs_resolve_to_node_paths(tmp_path: Path) -> None:
    job = load_job(_write(tmp_path, BASE.replace("train.py", "train.py ${{inputs.d}} ${{inputs.f}} ${{outputs.o}} "
                                                 "${{outputs.m}} ${{inputs.u}}") +
                          "inputs:\n  d:\n    path: azureml://datastores/ws/paths/data/\n"
                          "  f:\n    type: uri_file\n    path: azureml://datastores/ws/paths/a/b.csv\n    mode: download\n"
                          "  u:\n    path: azureml://datastores/ws/paths/raw\n    mode: direct\n"
                          "outputs:\n  o:\n    mode: upload\n"
                          "  m:\n    path: azureml://datastores/ws/paths/models\n"))
    wd = f"/mnt/azureml/cr/j/{run_folder_id('r')}/cap/data-capability/wd"
    assert job.outputs["o"] == DataInput("uri_folder", "", DataMode.UPLOAD)
    assert resolve_command(job, "r").split()[2:] == [
        f"{wd}/INPUT_d", f"{wd}/INPUT_f/b.csv", f"{wd}/o", f"{wd}/m", "azureml://datastores/ws/paths/raw"]


def test_services_are_read_and_those_not_emulated_are_noticed(tmp_path: Path) -> None:
    """Azure ML opens interactive endpoints beside a job (`services:`): jupyter_lab and tensor_board
    run here (tests/test_services.py); the others run without, and the dry run and the run's
    lifecycle say so for each (never silently dropped)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "t.py").write_text("print(1)\n")
    yml = tmp_path / "job.yml"
    yml.write_text("code: src\ncommand: python t.py\ncompute: azureml:c1\nservices:\n"
                   "  my_jupyter:\n    type: jupyter_lab\n  my_tb:\n    type: tensor_board\n    log_dir: outputs/tb\n"
                   "  my_code:\n    type: vs_code\n")
    job = load_job(yml)
    assert [(s.name, s.type, s.log_dir) for s in job.services] == [
        ("my_jupyter", "jupyter_lab", None), ("my_tb", "tensor_board", "outputs/tb"), ("my_code", "vs_code", None)]
    assert [n for n in job.notices if n.startswith("services.")] == [job.services[2].notice]
    assert job.services[2].notice.startswith("services.my_code (vs_code) is not emulated")
    assert job_from_record(job_to_record(job)) == job  # the supervisor reads it back from the record
    emu = Emulator(home=tmp_path / "home", backend="process")
    try:
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1))
        assert set(job.notices) <= set(emu.plan_job(yml)["notices"])  # the run's launch plan: the same function
    finally:
        emu.cleanup()
    (tmp_path / "bad.yml").write_text("code: src\ncommand: python t.py\ncompute: azureml:c1\nservices:\n  s: {}\n")
    with pytest.raises(ConfigError, match="services.s.type: missing"):
        load_job(tmp_path / "bad.yml")


@pytest.mark.parametrize("command,noticed", [
    ("pip install pygit2; python hello-git.py", True),
    ("echo start && python -m pip install --quiet papermill", True),
    ("conda install -y numpy\npython t.py", True),
    ("echo pipe install", False),
    ("ls ./pip_install_helper", False),
])
def test_a_command_that_installs_packages_as_it_runs_is_noticed(command: str, noticed: bool, tmp_path: Path) -> None:
    job = job_from_dict({"command": command, "compute": "azureml:c1"}, base_dir=tmp_path)
    found = [n for n in job.notices if n.startswith("command: it installs packages")]
    assert bool(found) is noticed
