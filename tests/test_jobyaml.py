"""The CLI v2 job YAML: the seed's job loads, bad input is refused with the field named."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from emulator.contract import resolve_command
from emulator.errors import ConfigError
from emulator.jobyaml import apply_overrides, load_job, script_of
from emulator.specs import DataInput, DistributionType, InputMode

SEED_JOB = REPO / "trainer" / "job.yml"


def test_the_seed_job_loads_with_its_data_path_overridden(mnist_subset: Path) -> None:
    job = load_job(SEED_JOB, [f"inputs.data_dir.path={mnist_subset}"])
    assert job.code == REPO / "trainer" and job.compute == "gpucluster"
    assert job.experiment_name == "pytorch-horovod"
    assert (job.instance_count, job.distribution.type, job.distribution.process_count_per_instance) == (
        2, DistributionType.MPI, 1)
    assert job.inputs["data_dir"] == DataInput("uri_folder", str(mnist_subset), InputMode.RO_MOUNT)
    assert job.image is None  # an azureml: environment is not a Docker image
    assert resolve_command(job, "r1") == ("python train.py --data-dir "
                                          "/mnt/azureml/cr/j/r1/cap/data-capability/wd/INPUT_data_dir --epochs 2")


def test_the_seed_job_says_datastores_are_not_there_yet() -> None:
    with pytest.raises(ConfigError, match=r"^inputs.data_dir.path: azureml://datastores/workspaceblobstore/paths/"
                                          r"mnist: datastore and cloud URIs are not emulated yet; use a local folder"):
        load_job(SEED_JOB)


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
    (BASE + "distribution:\n  type: tensorflow\n", "distribution.type: 'tensorflow' is not supported"),
    (BASE + "distribution:\n  type: mpi\n  process_count_per_instance: 0\n",
     "distribution.process_count_per_instance: must be at least 1, got 0"),
    (BASE + "distribution:\n  type: mpi\n  processes: 2\n", "distribution.processes: unknown field"),
    ("code: src\ncommand: python train.py\n", "compute: missing; set compute: azureml:<cluster name>"),
    ("code: nowhere\ncommand: python train.py\ncompute: c1\n", "code: "),
    ("code: src\ncommand: python missing.py\ncompute: c1\n", "command: script missing.py not found in code folder"),
    ("code: src\ncompute: c1\n", "command: missing"),
    (BASE.replace("train.py", "train.py ${{inputs.lr}}"), "command: ${{inputs.lr}} refers to nothing"),
    (BASE + "type: sweep\n", "type: 'sweep' jobs are not supported"),
    (BASE + "limits:\n  timeout: 0\n", "limits.timeout: must be a positive number of seconds, got 0"),
    (BASE + "inputs:\n  d:\n    type: uri_folder\n    path: ./nothing\n", "inputs.d.path: "),
    (BASE + "inputs:\n  d:\n    type: uri_folder\n    path: src\n    mode: eval_mount\n",
     "inputs.d.mode: 'eval_mount' is not emulated for inputs"),
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


def test_experiment_defaults_to_the_code_folder(tmp_path: Path) -> None:
    assert load_job(_write(tmp_path, BASE)).experiment_name == "src"


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
