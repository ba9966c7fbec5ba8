"""What users run around a pipeline job: `job stream` following its steps in order, `job download`
of its own logs, a pipeline-level output and (--all) each step's child job, and the pytest
plugin's `aml_pipeline` helper (fixtures/pipelines.py) giving each step's outputs and naming the
failed step with its log tail."""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import STARTUP

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.errors import NotFoundError
from amlemu.pipelines import follow
from amlemu.pipelines.pipelinespec import pipeline_from_dict
from amlemu.specs import RunStatus
from amlemu.storage.datastores import DatastoreSpec
from amlemu.targets import pipelinedownload
from pytest_amlemu.pipelines import PipelineFailed, PipelineRunner, with_compute
from pytest_amlemu.plugin import JobRunner

STEP = """
import pathlib, sys
what, args = sys.argv[1], sys.argv[2:]
if what == "make":
    pathlib.Path(args[0], "rows.txt").write_text("a\\nb\\nc\\n")
    print("made 3 rows", flush=True)
elif what == "check":
    rows = pathlib.Path(args[0], "rows.txt").read_text().split()
    pathlib.Path(args[1], "report.txt").write_text(f"ok {len(rows)}")
    print(f"checked {len(rows)} rows", flush=True)
elif what == "bad":
    print("row 2 is corrupt", flush=True)
    sys.exit(3)
"""
ENV = "azureml:AzureML-sklearn-1.5@latest"


def pipeline(settings: dict | None = None, extra: dict | None = None) -> dict:
    """make -> check, check's report bound to the pipeline's output `report`."""
    def step(command: str, **ports: dict) -> dict:
        return {"type": "command", "code": "src", "environment": ENV, "command": f"python step.py {command}", **ports}
    jobs = {"make": step("make ${{outputs.data}}", outputs={"data": {"type": "uri_folder"}}),
            "check": step("check ${{inputs.data}} ${{outputs.report}}",
                          inputs={"data": "${{parent.jobs.make.outputs.data}}"},
                          outputs={"report": "${{parent.outputs.report}}"})}
    return {"type": "pipeline", "experiment_name": "pipecli", "outputs": {"report": {"type": "uri_folder"}},
            "settings": {"default_compute": "azureml:c1", "default_datastore": "azureml:steps", **(settings or {})},
            "jobs": {**jobs, **(extra or {})}}


def local_datastore(emu: Emulator, tmp_path: Path) -> None:
    """The steps' outputs go to a local datastore: no Azurite to start (seconds in make test)."""
    emu.datastores.create(DatastoreSpec("steps", "local", folder=str(tmp_path / "steps")))


def write(root: Path, data: dict) -> Path:
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "step.py").write_text(STEP)
    path = root / "pipeline.yml"
    path.write_text(json.dumps(data))  # JSON is YAML
    return path


def files(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*") if p.is_file()}


# --- pure parts -------------------------------------------------------------------------------------
def test_the_steps_that_never_ran_are_named_with_why() -> None:
    steps = [{"step": "make", "child_job": "p_make", "status": "Completed", "detail": ""},
             {"step": "check", "child_job": None, "status": "NotStarted", "detail": "not run: step make Failed"}]
    assert follow.not_run_lines(steps) == ["=== step check: NotStarted (not run: step make Failed)\n"]


def test_a_sweep_steps_stream_is_its_decisions_and_a_command_steps_its_rank_0_log(tmp_path: Path) -> None:
    class Child:  # the parts of a Run that step_log reads
        def __init__(self, kind: str) -> None:
            self.record, self.dir = SimpleNamespace(job={"kind": kind}), tmp_path

        def logs(self, process: int = 0) -> str:
            return "rank 0 says hi\n"
    (tmp_path / "azureml-logs").mkdir()
    (tmp_path / "azureml-logs" / "hyperdrive.txt").write_text("[GENERATOR][INFO] trial 1: lr=0.1\n")
    assert follow.step_log(Child("sweep")) == "[GENERATOR][INFO] trial 1: lr=0.1\n"  # type: ignore[arg-type]
    assert follow.step_log(Child("command")) == "rank 0 says hi\n"  # type: ignore[arg-type]


def test_a_pipeline_output_comes_from_the_step_bound_to_it_or_the_run_that_step_reused(tmp_path: Path) -> None:
    spec = pipeline_from_dict(pipeline(), base_dir=tmp_path)
    steps = [{"step": "make", "child_job": "p_make"}, {"step": "check", "child_job": "p_check"}]
    uri = "azureml://datastores/steps/paths/azureml/{}/report/"
    assert pipelinedownload.output_uris(spec, steps) == {"report": uri.format("p_check")}
    assert pipelinedownload.output_uris(spec, [steps[0], {**steps[1], "outputs_from": "q_check"}]) == \
        {"report": uri.format("q_check")}
    assert pipelinedownload.output_uris(spec, steps[:1]) == {}  # check never ran
    assert "has not run" in str(pipelinedownload.missing_output(spec, "p", "report"))
    unknown = str(pipelinedownload.missing_output(spec, "p", "model"))
    assert isinstance(pipelinedownload.missing_output(spec, "p", "model"), NotFoundError)
    assert "pipeline p has: default, report" in unknown and "amlemu job download -n p_<step>" in unknown


def test_the_plugin_puts_every_step_on_the_tests_cluster() -> None:
    data = pipeline(extra={"side": {"type": "command", "compute": "azureml:gpu", "command": "true", "environment": ENV}})
    moved = with_compute({**data, "compute": "azureml:other"}, "t1")
    assert moved["settings"]["default_compute"] == "azureml:t1" and "compute" not in moved
    assert moved["jobs"]["side"]["compute"] == "azureml:t1" and "compute" not in moved["jobs"]["make"]
    assert data["jobs"]["side"]["compute"] == "azureml:gpu"  # the caller's dict is left as it was


# --- end to end, on process nodes ------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_stream_follows_each_step_in_order_and_download_lays_out_the_pipeline_and_its_steps(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster()
    local_datastore(emu, tmp_path)
    env = {"AMLEMU_HOME": str(emu.home.root)}
    streamed = CliRunner().invoke(cli, ["job", "create", "-f", str(write(tmp_path, pipeline())), "-n", "pipe1",
                                        "--stream"], env=env)
    assert streamed.exit_code == 0, streamed.output
    out = streamed.output
    order = ["RunId: pipe1", "=== step make (job pipe1_make) ===", "made 3 rows", "=== step make: Completed",
             "=== step check (job pipe1_check) ===", "checked 3 rows", "=== step check: Completed", "Status: Completed"]
    assert [out.find(line) for line in order] == sorted(out.find(line) for line in order) and -1 not in \
        [out.find(line) for line in order], out

    shown = CliRunner().invoke(cli, ["job", "show", "-n", "pipe1"], env=env)
    as_json = json.loads(CliRunner().invoke(cli, ["job", "show", "-n", "pipe1", "-o", "json"], env=env).output)
    report = as_json["amlemu"]["pipeline"]["outputs"]["report"]  # the pipeline-level output, where its step wrote it
    assert "/azureml/pipe1_check/" in report and f"output report: {report}" in shown.output, shown.output

    dest = tmp_path / "dl"
    planned = CliRunner().invoke(cli, ["job", "download", "pipe1", "--all", "-p", str(dest), "--dry-run", "-o", "json"],
                                 env=env)
    assert planned.exit_code == 0, planned.output
    assert [(a["what"], a["name"]) for a in json.loads(planned.output)["actions"]] == [
        ("run files", "pipe1"), ("named output", "report"), ("run files", "pipe1_make"), ("named output", "data"),
        ("run files", "pipe1_check"), ("named output", "report")]
    assert not dest.exists()
    done = CliRunner().invoke(cli, ["job", "download", "pipe1", "--all", "-p", str(dest), "-o", "json"], env=env)
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["done"] == [str(dest / name) for name in ("pipe1", "pipe1_make", "pipe1_check")]
    assert "system_logs/driver.txt" in files(dest / "pipe1")  # the pipeline's own log
    assert files(dest / "pipe1" / "named-outputs" / "report") == {"report.txt": "ok 3"}  # a pipeline-level output
    assert files(dest / "pipe1_make" / "named-outputs" / "data") == {"rows.txt": "a\nb\nc\n"}  # each step's, as
    assert "checked 3 rows" in "".join(files(dest / "pipe1_check").values())  # its own --all lays it out

    one = CliRunner().invoke(cli, ["job", "download", "pipe1", "--output-name", "report", "-p", str(tmp_path / "o")],
                             env=env)
    assert one.exit_code == 0, one.output
    assert files(tmp_path / "o") == {"pipe1/named-outputs/report/report.txt": "ok 3"}
    wrong = CliRunner().invoke(cli, ["job", "download", "pipe1", "--output-name", "data", "-p", str(tmp_path / "x")],
                               env=env)
    assert wrong.exit_code != 0 and "pipeline pipe1 has: default, report" in wrong.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_the_plugin_helper_gives_each_steps_outputs_and_names_the_failed_step_with_its_log(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    local_datastore(emu, tmp_path)
    runner = PipelineRunner(JobRunner(emu, lambda **_: cluster(), {"timeout": STARTUP}, tmp_path))
    bad = {"type": "command", "code": "src", "environment": ENV, "command": "python step.py bad"}
    write(tmp_path, {})  # its code folder
    data = pipeline({"continue_on_step_failure": True, "default_compute": "azureml:elsewhere"}, {"bad": bad})
    result = runner(data, expect=None)
    assert result.status is RunStatus.FAILED
    assert {name: s.status for name, s in result.steps.items()} == {"make": "Completed", "check": "Completed",
                                                                     "bad": "Failed"}
    assert (result.steps["make"].outputs["data"] / "rows.txt").read_text() == "a\nb\nc\n"
    assert (result.outputs["report"] / "report.txt").read_text() == "ok 3"
    assert "checked 3 rows" in result.steps["check"].logs()
    with pytest.raises(PipelineFailed) as failed:
        result.check()
    message = str(failed.value)
    assert message.startswith(f"expected Completed, but pipeline {result.run.id} ended Failed")
    assert f"step bad ({result.run.id}_bad): Failed" in message and "row 2 is corrupt" in message
    with pytest.raises(KeyError, match="step make has no output 'model'; it has: data"):
        result.steps["make"].outputs["model"]

    streamed = CliRunner().invoke(cli, ["job", "stream", result.run.id], env={"AMLEMU_HOME": str(emu.home.root)})
    assert streamed.exit_code == 1 and "=== step bad: Failed" in streamed.output  # as for any failed job
