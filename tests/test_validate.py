"""`amlemu job validate`: each rule Azure ML applies, caught before submission, naming field and fix."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.api import Emulator
from emulator.cli import cli
from emulator.specs import ClusterSpec
from emulator.validate import SNAPSHOT_MAX_BYTES, SNAPSHOT_MAX_FILES, validate_file

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
    ("resources.instance_count=3", "error: resources.instance_count: 3 nodes, compute c1 has at most 2; "
                                   "lower instance_count or raise max_instances"),
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
