"""Pipeline jobs (emulator/pipelines/submit.py, driver.py) on an emulated cluster: each step a child
job started when the steps it reads completed, data passed through default outputs, independent
steps at once, a failed step with both continue_on_step_failure settings, a cancel, a 2-node MPI step, and what
`job show` / `job list --parent-job-name` print."""
from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import STARTUP

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.pipelines import submit as pipelines
from amlemu.specs import RunStatus

STEP = """
import pathlib, sys, time
what, args = sys.argv[1], sys.argv[2:]
if what == "prepare":
    pathlib.Path(args[0], "data.txt").write_text(args[1] + " from prepare")
    time.sleep(float(args[2]))
elif what == "sleep":
    time.sleep(float(args[0]))
elif what == "train":
    text = pathlib.Path(args[0], "data.txt").read_text()
    pathlib.Path(args[1], "model.txt").write_text(text + ", trained")
elif what == "eval":
    print("eval read:", pathlib.Path(args[0], "model.txt").read_text(), flush=True)
elif what == "ranks":  # each MPI rank writes its own file into the step's output
    import os
    pathlib.Path(args[0], f"rank-{os.environ['OMPI_COMM_WORLD_RANK']}.txt").write_text(os.uname().nodename)
elif what == "list":
    print("listed:", sorted(p.name for p in pathlib.Path(args[0]).iterdir()), flush=True)
elif what == "fail":
    time.sleep(float(args[0]))
    sys.exit(3)
"""
ENV = "environment: azureml:AzureML-sklearn-1.5@latest"
TRAIN = f"""
type: command
name: train
code: src
{ENV}
command: python step.py train ${{{{inputs.data}}}} ${{{{outputs.model}}}}
inputs: {{data: {{type: uri_folder}}}}
outputs: {{model: {{type: uri_folder}}}}
"""


def write_pipeline(root: Path, settings: str, jobs: str) -> Path:
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "step.py").write_text(STEP)
    (root / "train.yml").write_text(TRAIN)  # a component from a file: its code folder relative to it
    path = root / "pipeline.yml"
    path.write_text(f"type: pipeline\nexperiment_name: pipe\nsettings: {{default_compute: azureml:c1{settings}}}\n"
                    "inputs: {greeting: hello}\njobs:\n" + textwrap.indent(textwrap.dedent(jobs), "  "))
    return path


def step(command: str, extra: str = "") -> str:
    return f"  type: command\n  code: src\n  {ENV}\n  command: python step.py {command}\n" + extra


CHAIN = (
    "prepare:\n" + step("prepare ${{outputs.data}} ${{inputs.greeting}} 2",
                        "  inputs: {greeting: '${{parent.inputs.greeting}}'}\n  outputs: {data: {type: uri_folder}}\n")
    + "side:\n" + step("sleep 2")
    + "train:\n  component: ./train.yml\n  inputs: {data: '${{parent.jobs.prepare.outputs.data}}'}\n"
    + "eval:\n" + step("eval ${{inputs.model}}", "  inputs: {model: '${{parent.jobs.train.outputs.model}}'}\n"))


def child(emu: Emulator, pipeline: str, name: str):  # type: ignore[no-untyped-def]
    return emu.run(pipelines.child_name(pipeline, name))


def running_at(run) -> float:  # type: ignore[no-untyped-def]
    return next(t for t, status, _ in run.events() if status is RunStatus.RUNNING)


def ended_at(run) -> float:  # type: ignore[no-untyped-def]
    return next(t for t, status, _ in run.events() if status.is_terminal)


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_chain_passes_data_through_default_outputs_and_independent_steps_run_at_once(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster()
    run = emu.submit(write_pipeline(tmp_path, "", CHAIN))
    assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    steps = {s: child(emu, run.id, s) for s in ("prepare", "side", "train", "eval")}
    assert {s: r.status for s, r in steps.items()} == dict.fromkeys(steps, RunStatus.COMPLETED)
    assert "eval read: hello from prepare, trained" in steps["eval"].log_path(0).read_text()
    assert steps["train"].record.job["display_name"] == "train" and steps["train"].record.parent == run.id
    assert steps["train"].record.job["command"].startswith("python step.py train ")  # its component's command
    # prepare and side read nothing: both ran at once (each Running before the other ended)
    assert running_at(steps["side"]) < ended_at(steps["prepare"]) and running_at(steps["prepare"]) < ended_at(steps["side"])
    assert running_at(steps["train"]) >= ended_at(steps["prepare"])  # train waited for what it reads
    env = {"AMLEMU_HOME": str(emu.home.root)}
    shown = CliRunner().invoke(cli, ["job", "show", run.id], env=env)
    assert shown.exit_code == 0, shown.output
    assert f"eval                 {run.id}_eval" in shown.output and "Completed" in shown.output
    listed = CliRunner().invoke(cli, ["job", "list", "--parent-job-name", run.id, "-o", "json"], env=env)
    assert sorted(j["name"] for j in json.loads(listed.output)) == sorted(r.id for r in steps.values())
    top = CliRunner().invoke(cli, ["job", "list", "-o", "json"], env=env)
    assert [j["name"] for j in json.loads(top.output)] == [run.id]  # steps only under their parent


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_failed_step_stops_its_dependents_and_without_continue_on_step_failure_cancels_the_running_ones(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster()
    jobs = ("bad:\n" + step("fail 0", "  outputs: {data: {type: uri_folder}}\n")
            + "after_bad:\n" + step("train ${{inputs.data}} ${{outputs.model}}",
                                    "  inputs: {data: '${{parent.jobs.bad.outputs.data}}'}\n  outputs: {model: {}}\n"))
    going = emu.submit(write_pipeline(tmp_path / "on", ", continue_on_step_failure: true",
                                      jobs + "good:\n" + step("sleep 1")))
    assert going.wait(timeout=STARTUP) is RunStatus.FAILED
    assert child(emu, going.id, "good").status is RunStatus.COMPLETED  # the independent branch went on
    assert child(emu, going.id, "bad").status is RunStatus.FAILED
    assert not emu.store.run_exists(pipelines.child_name(going.id, "after_bad"))  # it reads the failed step's output
    after_bad = next(s for s in pipelines.read_steps(going.dir)["steps"] if s["step"] == "after_bad")  # type: ignore[index]
    assert after_bad["status"] == "NotStarted" and "not run: step bad Failed" in after_bad["detail"]

    stopping = emu.submit(write_pipeline(tmp_path / "off", "", jobs.replace("fail 0", "fail 2")
                                         + "slow:\n" + step("sleep 300")))
    assert stopping.wait(timeout=STARTUP) is RunStatus.FAILED
    assert (stopping.record.error or "").startswith("step(s) bad failed")
    assert child(emu, stopping.id, "slow").status is RunStatus.CANCELED  # Azure ML's default: the rest is canceled
    assert "step bad Failed" in " ".join(d for _, _, d in child(emu, stopping.id, "slow").events())


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_canceled_pipeline_cancels_its_steps(emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster()
    path = write_pipeline(tmp_path, "", "slow:\n" + step("sleep 300", "  outputs: {out: {}}\n") + "later:\n"
                          + step("eval ${{inputs.model}}", "  inputs: {model: '${{parent.jobs.slow.outputs.out}}'}\n"))
    env = {"AMLEMU_HOME": str(emu.home.root)}
    planned = CliRunner().invoke(cli, ["job", "create", "-f", str(path), "--dry-run", "-o", "json"], env=env)
    assert json.loads(planned.output)["run_order"] == ["slow", "later"], planned.output
    created = CliRunner().invoke(cli, ["job", "create", "-f", str(path), "-o", "json"], env=env)
    assert created.exit_code == 0, created.output
    run = emu.run(json.loads(created.output)["name"])
    assert json.loads(created.output)["type"] == "pipeline"
    slow = first_step_running(emu, run)
    emu.cancel(run.id)
    assert run.wait(timeout=STARTUP) is RunStatus.CANCELED
    assert emu.run(slow).wait(timeout=STARTUP) is RunStatus.CANCELED
    assert not emu.store.run_exists(pipelines.child_name(run.id, "later"))

    orphan = emu.submit(path)  # its driver killed: the next look at the home ends it and its steps
    slow = first_step_running(emu, orphan)
    os.kill(orphan.record.supervisor_pid, signal.SIGKILL)  # the driver this test started, by its pid
    deadline = time.monotonic() + STARTUP
    while not emu.reconcile() and time.monotonic() < deadline:  # the pid may linger a moment as a zombie
        time.sleep(0.1)
    assert orphan.status is RunStatus.FAILED
    assert emu.run(slow).wait(timeout=STARTUP) is RunStatus.CANCELED


def first_step_running(emu: Emulator, run) -> str:  # type: ignore[no-untyped-def]
    """The pipeline's first step's child job, once it runs (a deadline, not a wait)."""
    slow, deadline = pipelines.child_name(run.id, "slow"), time.monotonic() + STARTUP
    while not (emu.store.run_exists(slow) and emu.store.run(slow).status is RunStatus.RUNNING):
        assert not run.status.is_terminal and time.monotonic() < deadline, run.record.error
        time.sleep(0.1)
    return slow


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_steps_2_node_mpi_job_writes_one_output_the_next_step_reads_whole(emu: Emulator, cluster,
                                                                            tmp_path: Path) -> None:
    cluster()
    jobs = ("train:\n" + step("ranks ${{outputs.model}}", "  outputs: {model: {type: uri_folder}}\n"
                              "  distribution: {type: mpi, process_count_per_instance: 1}\n"
                              "  resources: {instance_count: 2}\n")
            + "eval:\n" + step("list ${{inputs.model}}", "  inputs: {model: '${{parent.jobs.train.outputs.model}}'}\n"))
    run = emu.submit(write_pipeline(tmp_path, "", jobs))
    assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    train = child(emu, run.id, "train")
    assert len(train.record.nodes) == 2  # the step ran on two nodes, one rank each
    assert "listed: ['rank-0.txt', 'rank-1.txt']" in child(emu, run.id, "eval").log_path(0).read_text()


@pytest.mark.parametrize("backend", ["process"], indirect=True)
@pytest.mark.parametrize(("change", "field"), [
    ("  environment: azureml:no-such-env@latest\n", "jobs.eval.environment"),
    ("  compute: azureml:no-such-compute\n", "jobs.eval.compute"),
], ids=["environment", "compute"])
def test_a_later_step_that_breaks_a_rule_is_refused_at_submit_before_anything_runs(
        emu: Emulator, cluster, tmp_path: Path, change: str, field: str) -> None:
    cluster()
    jobs = CHAIN.replace(f"  {ENV}\n  command: python step.py eval", "  command: python step.py eval")
    jobs = jobs.replace("eval:\n", "eval:\n" + change) if "environment" in change else \
        jobs.replace("eval:\n", f"eval:\n  {ENV}\n" + change)
    path = write_pipeline(tmp_path, "", jobs)
    with pytest.raises(Exception) as refused:
        emu.submit(path)
    assert getattr(refused.value, "field", "") == field, refused.value
    assert emu.store.runs() == []  # nothing was made: no pipeline, no step
