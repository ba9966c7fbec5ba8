"""`amlemu job validate`: each rule Azure ML applies, caught before submission, naming field and fix."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.specs import ClusterSpec
from amlemu.validate import SNAPSHOT_MAX_BYTES, SNAPSHOT_MAX_FILES, validate_file

GOOD = """
code: src
command: python train.py --data ${{inputs.data}}
environment: azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest
compute: azureml:c1
resources: {instance_count: 2}
distribution: {type: mpi, process_count_per_instance: 1}
inputs:
  data: {path: azureml://datastores/workspaceblobstore/paths/vdata}
"""


@pytest.fixture
def workspace(tmp_path: Path):
    emu = Emulator(home=tmp_path / "home", backend="process")
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.txt").write_text("x")
    emu.datastores.upload(tmp_path / "d", "azureml://datastores/workspaceblobstore/paths/vdata")
    yield emu
    emu.cleanup()


def _job(tmp_path: Path, text: str = GOOD) -> Path:
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "train.py").write_text("print('hi')\n")
    (tmp_path / "job.yml").write_text(text)
    return tmp_path / "job.yml"


def _lines(findings) -> list[str]:  # type: ignore[no-untyped-def]
    return [f.line() for f in findings]


def test_a_good_job_passes(workspace: Emulator, tmp_path: Path) -> None:
    assert validate_file(_job(tmp_path), emu=workspace) == []


@pytest.mark.parametrize(("override", "expected"), [
    ("environment=", "error: environment: missing; give environment: azureml:<name>@latest or an image"),
    ("environment=myorg/trainer:1", "warning: environment: cannot tell whether myorg/trainer:1 has Open MPI"),
    ("compute=azureml:nope", "error: compute: 'nope' does not exist in the workspace (computes: c1)"),
    ("resources.instance_count=3", "error: resources.instance_count: 3 nodes exceed max_instances 2 of compute 'c1'; "
                                   "lower instance_count or raise the compute's max_instances"),
    ("inputs.data.path=azureml://datastores/workspaceblobstore/paths/absent",
     "error: inputs.data.path: nothing at azureml://datastores/workspaceblobstore/paths/absent; upload it"),
    ("inputs.data.path=azureml://datastores/other/paths/x", "error: inputs.data.path: datastore 'other' not found"),
    ("inputs.data.mode=rw_mount", "error: inputs.data.mode: rw_mount is not allowed here; use one of: ro_mount, download, direct"),
    ("distribution.process_count_per_instance=0", "error: distribution.process_count_per_instance: must be at least 1"),
])
def test_each_rule_names_the_field_and_fix(workspace: Emulator, tmp_path: Path, override: str, expected: str) -> None:
    findings = validate_file(_job(tmp_path), [override], emu=workspace)
    assert any(line.startswith(expected) for line in _lines(findings)), _lines(findings)


def test_the_code_snapshot_limits_and_amlignore(tmp_path: Path) -> None:
    job = _job(tmp_path)
    for i in range(SNAPSHOT_MAX_FILES):
        (tmp_path / "src" / f"f{i}.txt").touch()
    with open(tmp_path / "src" / "weights.bin", "wb") as fh:  # sparse: no real disk used
        fh.truncate(SNAPSHOT_MAX_BYTES + 1)
    lines = _lines(validate_file(job))
    assert any(line.startswith(f"error: code: {SNAPSHOT_MAX_FILES + 2} files in the snapshot, Azure ML takes at "
                               f"most {SNAPSHOT_MAX_FILES}") for line in lines), lines
    assert any(line.startswith("error: code: the snapshot is 300 MB, Azure ML takes at most 300 MB") for line in lines)
    (tmp_path / "src" / ".amlignore").write_text("# data stays out\nf*.txt\n*.bin\n")
    assert validate_file(job) == []


def test_the_cli_exits_1_on_errors_and_prints_json(workspace: Emulator, tmp_path: Path) -> None:
    runner = CliRunner()
    home = ["--home", str(workspace.home.root)]
    ok = runner.invoke(cli, [*home, "job", "validate", "-f", str(_job(tmp_path))])
    assert ok.exit_code == 0 and "0 error(s), 0 warning(s)" in ok.output
    bad = runner.invoke(cli, [*home, "job", "validate", "-f", str(tmp_path / "job.yml"), "--set",
                              "resources.instance_count=5", "-o", "json"])
    assert bad.exit_code == 1
    assert json.loads(bad.output)[0]["field"] == "resources.instance_count"


# --- azure-ai-ml's own load_job, when the SDK is installed ------------------------------------------
def test_a_field_only_azure_ml_refuses_is_one_finding_from_its_schema(tmp_path: Path) -> None:
    """identity is a field the emulator takes without reading it; azure-ai-ml's load_job (what
    `az ml job create` runs first) refuses the type: that is the one finding."""
    job = _job(tmp_path, GOOD + "identity: {type: gold}\n")
    assert _lines(validate_file(job)) == ["error: identity.type: 'gold' is not allowed (azure-ai-ml); use one of: "
                                          "managed, managed_identity, aml_token, user_identity"]
    assert _lines(validate_file(job, ["identity.type=aml_token"])) == []  # --set reaches the SDK too


def test_a_problem_both_refuse_is_one_finding(tmp_path: Path) -> None:
    """The emulator names it first (its message, its fix); azure-ai-ml's message for the same field is
    dropped. Problems only azure-ai-ml sees are added, one per field."""
    job = _job(tmp_path)
    [only] = validate_file(job, ["resources.instance_count=two"])
    assert only.line() == "error: resources.instance_count: must be an integer, got 'two'; see the Azure ML job schema"
    job = _job(tmp_path, GOOD.replace("resources: {instance_count: 2}", "resources: {instance_count: two}")
               + "bogus: 1\ntags: [a, b]\nlimits: {timeout: soon}\n")
    lines = _lines(validate_file(job))
    assert [line.split(":")[1].strip() for line in lines] == ["bogus", "tags", "resources.instance_count",
                                                             "limits.timeout"], lines
    assert lines[0].startswith("error: bogus: unknown field; known fields:")  # the emulator's, stopped at the first
    assert lines[1].startswith("error: tags: not a valid mapping type (azure-ai-ml)")
    assert lines[2] == ("error: resources.instance_count: not a valid integer (azure-ai-ml); "
                        "see https://aka.ms/ml-cli-v2-job-command-yaml-reference")


@pytest.mark.parametrize(("text", "expected"), [
    ("distribution: {type: horovod}\n", "error: distribution.type: 'horovod' is not supported; use mpi, pytorch or tensorflow"),
    ("type: sweep\n", "error: code: is the trial's, not the sweep's; move it under trial: (trial.code)"),  # one line
    ("inputs: {data: {path: azureml://datastores/workspaceblobstore/paths/vdata, mode: rw_mount}}\n",
     "error: inputs.data.mode: rw_mount is not allowed here; use one of: ro_mount, download, direct"),
])
def test_the_emulators_finding_stands_alone(tmp_path: Path, text: str, expected: str) -> None:
    base = GOOD.replace("distribution: {type: mpi, process_count_per_instance: 1}\n", "")
    base = base[:base.index("inputs:")] if text.startswith("inputs") else base
    lines = _lines(validate_file(_job(tmp_path, base + text)))
    assert len(lines) == 1 and lines[0].startswith(expected), lines


def test_the_cli_prints_the_schemas_finding_and_nothing_else(tmp_path: Path) -> None:
    """No "experimental class" notices from azure-ai-ml on the terminal: one line per finding, a total."""
    job = _job(tmp_path, GOOD + "identity: {type: gold}\n")
    done = subprocess.run([sys.executable, "-c", "from amlemu.cli import main; main()", "job", "validate", "-f",
                           str(job)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "AMLEMU_HOME": str(tmp_path / "home"), "AMLEMU_BACKEND": "process"})
    assert done.returncode == 1 and done.stderr == "", done.stderr
    lines = done.stdout.splitlines()  # the workspace is empty: its compute is a finding too
    assert [line.split(":")[1] for line in lines[:-1]] == [" compute", " identity.type"], lines
    assert lines[-1].endswith("2 error(s), 0 warning(s)")
