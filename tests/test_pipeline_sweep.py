"""Sweep steps in a pipeline (emulator/pipelines/sweepstep.py): a `type: sweep` step over a command
component's inputs parses and is checked naming `jobs.<step>.<field>`, runs as the sweep job
`<pipeline>_<step>` whose trials are `<pipeline>_<step>_<n>`, and its dependents read its best
trial's outputs, as on Azure ML."""
from __future__ import annotations

import json
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from conftest import STARTUP

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.errors import ConfigError
from amlemu.pipelines import submit as pipelines
from amlemu.pipelines import sweepstep
from amlemu.pipelines.pipelinespec import load_pipeline
from amlemu.specs import RunStatus
from amlemu.storage.datastores import DatastoreSpec
from amlemu.sweeps import results
from amlemu.sweeps.sweepspec import trial_job

# A trial writes its lr and its own job name into its model output and logs acc = lr; `read` prints
# what the model it was given says.
SCRIPT = """
import os, pathlib, sys
if sys.argv[1] == "train":
    lr, out = sys.argv[2], sys.argv[3]
    pathlib.Path(out, "model.txt").write_text(f"lr={lr} by {os.environ['AZUREML_RUN_ID']}")
    import mlflow
    mlflow.log_metric("acc", float(lr))
else:
    print("read:", pathlib.Path(sys.argv[2], "model.txt").read_text(), flush=True)
"""
TRAIN = """
type: command
name: train
code: src
environment: azureml:AzureML-sklearn-1.5@latest
command: python step.py train ${{inputs.lr}} ${{outputs.model}} $[[--depth ${{inputs.depth}}]]
inputs:
  lr: {type: number, default: 0.01, max: 1}
  depth: {type: integer, optional: true}
  data: {type: uri_folder, optional: true}
  kind: {type: string, default: a, enum: [a, b]}
outputs: {model: {type: uri_folder}}
"""
SWEEP = """
tune:
  type: sweep
  trial: ./train.yml
  inputs: {depth: 3}
  search_space: {lr: {type: choice, values: [0.2, 0.7, 0.4]}}
  sampling_algorithm: grid
  objective: {goal: maximize, primary_metric: acc}
  limits: {max_total_trials: 3, max_concurrent_trials: 3}
use:
  type: command
  code: src
  environment: azureml:AzureML-sklearn-1.5@latest
  command: python step.py read ${{inputs.model}}
  inputs: {model: '${{parent.jobs.tune.outputs.model}}'}
"""


def write_pipeline(root: Path, jobs: str = SWEEP, settings: str = "") -> Path:
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "step.py").write_text(SCRIPT)
    (root / "train.yml").write_text(TRAIN)
    path = root / "pipeline.yml"
    path.write_text("type: pipeline\nexperiment_name: pipe\nsettings: {default_compute: azureml:c1" + settings + "}\njobs:\n"
                    + textwrap.indent(textwrap.dedent(jobs), "  "))
    return path


def test_a_sweep_step_is_a_sweep_job_over_its_components_inputs(tmp_path: Path) -> None:
    spec = load_pipeline(write_pipeline(tmp_path))
    assert spec.steps["tune"].type == "sweep" and spec.steps["use"].upstream == ("tune",)
    sweep = sweepstep.sweep_job(spec, "tune", "p1", {})
    assert sweep.name == "p1_tune" and sweep.display_name == "tune" and sweep.space.names == ("lr",)
    assert sweep.experiment_name == "pipe" and sweep.compute == "c1"
    # the hyperparameter comes from the search space; the optional part the step gives a value stays
    assert sweep.job["command"] == "python step.py train ${{search_space.lr}} ${{outputs.model}} --depth ${{inputs.depth}}"
    assert sweep.job["inputs"] == {"depth": 3, "kind": "a"}
    trial = trial_job(sweep, {"lr": 0.7}, "p1_tune_1", code=None)
    assert trial.command.startswith("python step.py train 0.7 ")
    # each trial writes its outputs at its own default place, where the dependents look for the best one's
    assert trial.outputs["model"].path == "azureml://datastores/workspaceblobstore/paths/azureml/p1_tune_1/model/"


def test_a_value_the_step_binds_for_a_hyperparameter_is_the_search_spaces_to_give(tmp_path: Path) -> None:
    spec = load_pipeline(write_pipeline(tmp_path, SWEEP.replace("inputs: {depth: 3}", "inputs: {lr: 0.5}")))
    sweep = sweepstep.sweep_job(spec, "tune", "p1", {})
    assert "lr" not in sweep.job["inputs"] and "--depth" not in sweep.job["command"]  # depth: no value, part dropped


def test_the_step_reads_the_best_trial_only_when_it_completed_with_the_primary_metric(tmp_path: Path) -> None:
    emu = SimpleNamespace(home=SimpleNamespace(run_dir=lambda name: tmp_path / name))
    trials = [{"name": "s_0", "status": "Completed"}, {"name": "s_1", "status": "Canceled"}]
    results.write(tmp_path / "s", {"best_child_run_id": "s_0", "trials": trials})
    assert sweepstep.best_trial(emu, "s") == "s_0"  # type: ignore[arg-type]
    results.write(tmp_path / "s", {"best_child_run_id": "s_1", "trials": trials})  # scored, but canceled
    assert sweepstep.best_trial(emu, "s") is None  # type: ignore[arg-type]
    results.write(tmp_path / "s", {"best_child_run_id": None, "trials": trials})  # no metric logged
    assert sweepstep.best_trial(emu, "s") is None  # type: ignore[arg-type]


def test_a_sweep_steps_data_input_is_bound_to_the_upstream_steps_output(tmp_path: Path) -> None:
    prep = ("prep:\n  code: src\n  environment: azureml:AzureML-sklearn-1.5@latest\n"
            "  command: python step.py read ${{outputs.data}}\n  outputs: {data: {type: uri_folder}}\n")
    spec = load_pipeline(write_pipeline(tmp_path, prep + SWEEP.replace(
        "inputs: {depth: 3}", "inputs: {data: '${{parent.jobs.prep.outputs.data}}'}")))
    assert spec.steps["tune"].upstream == ("prep",)
    sweep = sweepstep.sweep_job(spec, "tune", "p1", {"prep": "p1_prep"})
    assert sweep.job["inputs"]["data"]["path"] == "azureml://datastores/workspaceblobstore/paths/azureml/p1_prep/data/"


@pytest.mark.parametrize("old, new, message", [
    ("  search_space: {lr: {type: choice, values: [0.2, 0.7, 0.4]}}\n", "",
     "jobs.tune.search_space: missing"),
    ("{lr: {type: choice", "{rate: {type: choice", "jobs.tune.search_space.rate: the trial component has no input "
                                                   "'rate'; the search space is over its inputs: lr, depth"),
    ("{lr: {type: choice, values: [0.2, 0.7, 0.4]}}", "{data: {type: choice, values: [a]}}",
     "jobs.tune.search_space.data: 'data' is a uri_folder input: a search space samples values, not data"),
    ("values: [0.2, 0.7, 0.4]", "values: [0.2, 1.5]", "jobs.tune.search_space.lr: "),
    ("{lr: {type: choice, values: [0.2, 0.7, 0.4]}}", "{kind: {type: choice, values: [a, c]}}",
     "jobs.tune.search_space.kind: "),
    ("values: [0.2, 0.7, 0.4]", "values: [{a: 1}]", "jobs.tune.search_space.lr: a conditional choice's option"),
    ("{type: choice, values: [0.2, 0.7, 0.4]}", "{type: uniform, min_value: 0.1, max_value: 0.9}",
     "jobs.tune.sampling_algorithm: "),
    ("sampling_algorithm: grid", "sampling_algorithm: bayesian\n  early_termination: {type: median_stopping}",
     "jobs.tune.early_termination: bayesian sampling does not support early termination"),
    ("{goal: maximize, primary_metric: acc}", "{primary_metric: acc}", "jobs.tune.objective.goal: required"),
    ("{max_total_trials: 3, max_concurrent_trials: 3}", "{max_concurrent_trials: 3}",
     "jobs.tune.limits.max_total_trials: required"),
    ("  trial: ./train.yml\n", "", "jobs.tune.trial: missing"),
    ("  trial: ./train.yml\n", "  trial: ./train.yml\n  command: echo\n", "jobs.tune.command: unknown field"),
    ("'${{parent.jobs.tune.outputs.model}}'", "'${{parent.jobs.tune.outputs.nope}}'",
     "jobs.use.inputs.model: ${{parent.jobs.tune.outputs.nope}}: step tune has no output 'nope'"),
])
def test_each_invalid_sweep_step_is_refused_in_one_line_naming_the_field(tmp_path: Path, old: str, new: str,
                                                                         message: str) -> None:
    assert old in SWEEP
    with pytest.raises(ConfigError) as caught:
        load_pipeline(write_pipeline(tmp_path, SWEEP.replace(old, new)))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_pipelines_sweep_step_runs_its_trials_and_the_next_step_reads_the_best_trials_output(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster(max_nodes=3)
    emu.datastores.create(DatastoreSpec("steps", "local", folder=str(tmp_path / "steps")))  # no Azurite to start
    path = write_pipeline(tmp_path, settings=", default_datastore: azureml:steps")
    env = {"AMLEMU_HOME": str(emu.home.root)}
    planned = CliRunner().invoke(cli, ["job", "create", "-f", str(path), "--dry-run", "-o", "json"], env=env)
    assert json.loads(planned.output)["run_order"] == ["tune", "use"], planned.output  # the trial job checked
    created = CliRunner().invoke(cli, ["job", "create", "-f", str(path), "-o", "json"], env=env)
    assert created.exit_code == 0, created.output
    run = emu.run(json.loads(created.output)["name"])
    assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    sweep = emu.run(pipelines.child_name(run.id, "tune"))
    assert sweep.record.parent == run.id and sweep.status is RunStatus.COMPLETED
    trials = emu.runs(parent=sweep.id)
    assert sorted(t.id for t in trials) == [f"{sweep.id}_{n}" for n in range(3)]
    summary = results.read(sweep.dir)
    assert summary is not None and summary["best_child_run_id"] == f"{sweep.id}_1"  # grid: lr 0.7 is the 2nd
    use = emu.run(pipelines.child_name(run.id, "use"))
    assert f"read: lr=0.7 by {sweep.id}_1" in use.log_path(0).read_text()  # the best trial's output
    assert (tmp_path / "steps" / "azureml" / f"{sweep.id}_0" / "model" / "model.txt").is_file()  # each trial its own
    steps = {s["step"]: s for s in pipelines.read_steps(run.dir)["steps"]}  # type: ignore[index]
    assert steps["tune"]["child_job"] == sweep.id and steps["tune"]["outputs_from"] == f"{sweep.id}_1"
    shown = CliRunner().invoke(cli, ["job", "show", run.id], env=env)
    assert shown.exit_code == 0 and f"tune                 {sweep.id}" in shown.output, shown.output
    assert f"best trial {sweep.id}_1" in shown.output
    listed = CliRunner().invoke(cli, ["job", "list", "--parent-job-name", run.id, "-o", "json"], env=env)
    assert sorted(j["name"] for j in json.loads(listed.output)) == sorted([sweep.id, use.id])  # not the trials
    top = CliRunner().invoke(cli, ["job", "list", "-o", "json"], env=env)
    assert [j["name"] for j in json.loads(top.output)] == [run.id]
