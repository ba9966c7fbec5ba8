"""A step's `artifacts` output (emulator/pipelines/stepartifacts.py): written without a path, it is
the step's own run artifacts (./outputs, logs ...), which a dependent reads as
`${{inputs.x}}/outputs/<file>`. Which outputs are so (pure), which of a run's files are copied (links
and private files never), and one pipeline whose second step reads the first one's ./outputs."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from conftest import STARTUP

from amlemu.api import Emulator
from amlemu.pipelines import stepartifacts
from amlemu.pipelines import submit as pipelines
from amlemu.pipelines.pipelinespec import load_pipeline
from amlemu.runs import runfiles
from amlemu.specs import RunStatus

ENV = "environment: azureml:AzureML-sklearn-1.5@latest"
PIPELINE = f"""
type: pipeline
settings: {{default_compute: azureml:c1}}
jobs:
  make:
    command: echo made > ./outputs/made.txt && echo a log line
    {ENV}
    outputs:
      artifacts:
      kept: {{path: azureml://datastores/workspaceblobstore/paths/kept/}}
  read:
    command: cat ${{{{inputs.made}}}}/outputs/made.txt
    {ENV}
    inputs:
      made: ${{{{parent.jobs.make.outputs.artifacts}}}}
"""


def write(tmp_path: Path, text: str = PIPELINE) -> Path:
    path = tmp_path / "pipeline.yml"
    path.write_text(textwrap.dedent(text))
    return path


def test_only_an_inline_steps_artifacts_output_without_a_path_is_its_run_artifacts(tmp_path: Path) -> None:
    spec = load_pipeline(write(tmp_path))
    assert stepartifacts.artifacts_uri(spec, "make", "p_make") == \
        "azureml://datastores/workspaceblobstore/paths/azureml/p_make/artifacts/"
    assert stepartifacts.artifacts_uri(spec, "read", "p_read") is None  # it declares no such output
    given = load_pipeline(write(tmp_path, PIPELINE.replace(
        "      artifacts:\n", "      artifacts: {path: azureml://datastores/workspaceblobstore/paths/mine/}\n")))
    assert stepartifacts.artifacts_uri(given, "make", "p_make") is None  # a path of its own: the job writes it


def test_a_runs_artifacts_are_its_regular_files_never_a_link_nor_a_private_file(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "outputs" / "sub").mkdir(parents=True)
    (run / "outputs" / "sub" / "model.txt").write_text("m")
    (run / "user_logs").mkdir()
    (run / "user_logs" / "std_log.txt").write_text("log")
    (run / "system_logs").mkdir()
    (run / "system_logs" / "launch.json").write_text("{}")  # the launch plan: the job's variables
    secret = run / "outputs" / "token"
    secret.write_text("s")
    os.chmod(secret, 0o600)  # owner-only: the platform's
    (run / "outputs" / "passwd").symlink_to("/etc/passwd")
    (run / "logs").symlink_to(tmp_path)  # a folder swapped for a link: not walked
    (run / "snapshot").mkdir()
    (run / "snapshot" / "train.py").write_text("")  # the code: not an artifact
    assert [rel for rel, _ in runfiles.walk_files(run)] == ["outputs/sub/model.txt", "user_logs/std_log.txt"]


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_step_reads_the_outputs_folder_of_the_step_whose_artifacts_it_takes(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster()
    run = emu.submit(write(tmp_path))
    assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    read = emu.run(pipelines.child_name(run.id, "read"))
    assert "made" in read.log_path(0).read_text()
    copied = [name for name, _ in emu.datastores.ls(stepartifacts.artifacts_uri(
        pipelines.from_record(emu, run.record.job), "make", pipelines.child_name(run.id, "make")))]
    assert any(n.endswith("/outputs/made.txt") for n in copied) and not any("launch.json" in n for n in copied)
