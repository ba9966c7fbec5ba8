"""Sweep jobs (emulator/sweeps/): the YAML as az ml reads it, each trial the command job it runs, the
results Azure ML shows, and live sweeps on an emulated cluster: trials as child jobs of a 2-node MPI
trial, the early termination policy canceling a trial, a cancel, a primary metric never logged."""
from __future__ import annotations

import json
import os
import signal
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner
from conftest import FULL, REPO, STARTUP, TRAINING

from amlemu.api import Emulator
from amlemu.runs.handle import Run
from amlemu.cli import cli
from amlemu.errors import ConfigError
from amlemu.runs import memwatch
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.sweeps import results
from amlemu.sweeps.results import Trial
from amlemu.sweeps.sweepspec import load_sweep, sweep_from_record, sweep_to_record, trial_job

TRAIN = """
import argparse, os, time
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float); p.add_argument("--kind", default="good"); p.add_argument("--steps", type=int)
a = p.parse_args()
# Rank 0 logs (as distributed trainers do); a silent trial logs nothing (and pays no mlflow import).
logs = a.kind != "silent" and os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0"
if logs:
    import mlflow
for step in range(a.steps):
    if logs:
        mlflow.log_metric({metric!r}, (0.9 if a.kind == "good" else 0.1) - a.lr, step=step)
    time.sleep(0 if a.kind == "good" else {pause})  # a bad one runs on until a policy or a cancel stops it
print("done", a.kind, a.lr, flush=True)
"""


TRIAL = """
trial:
  code: src
  command: python train.py --lr ${{search_space.lr}} --kind ${{search_space.kind}} --steps ${{inputs.steps}}
  environment: azureml:AzureML-sklearn-1.5@latest
"""


def write_sweep(root: Path, body: str, *, metric: str = "accuracy", pause: float = 0.0) -> Path:
    (root / "src").mkdir(parents=True, exist_ok=True)
    (root / "src" / "train.py").write_text(TRAIN.format(metric=metric, pause=pause))
    path = root / "sweep.yml"
    path.write_text("type: sweep\nexperiment_name: tune\ncompute: azureml:c1\n" + TRIAL + textwrap.dedent(body))
    return path




# --- the YAML, each trial, the results: pure ----------------------------------------------------------
def test_a_trial_is_the_command_job_with_its_sampled_values_and_the_sweeps_limits(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, """
        inputs: {steps: 3}
        sampling_algorithm: grid
        search_space: {lr: {type: choice, values: [0.1]}, kind: {type: choice, values: [good, bad]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 4, trial_timeout: 600}
        """))
    job = trial_job(spec, {"lr": 0.1, "kind": "bad"}, "tune_3", code=tmp_path / "src")
    assert job.command == "python train.py --lr 0.1 --kind bad --steps ${{inputs.steps}}"  # inputs: bound at launch
    assert (job.name, job.compute, job.experiment_name, job.code) == ("tune_3", "c1", "tune", tmp_path / "src")
    assert job.max_run_duration_seconds == 600 and job.inputs == {"steps": 3}
    record = sweep_to_record(spec, "tune", tmp_path / "src")
    assert record["command"].endswith("--steps ${{inputs.steps}}") and "search_space.lr" in record["command"]
    assert sweep_from_record(record).to_dict()["search_space"] == spec.to_dict()["search_space"]  # the driver's copy


@pytest.mark.parametrize("body,message", [
    ("sampling_algorithm: random\nsearch_space: {lr: {type: uniform, min_value: 0.1, max_value: 0.2}}\n"
     "objective: {goal: maximize, primary_metric: a}\nlimits: {max_total_trials: 2}\n",
     "trial.command: ${{search_space.kind}} is not in search_space (it has: lr); name a hyperparameter"),
    ("sampling_algorithm: bayesian\nsearch_space: {lr: {type: uniform, min_value: 0.1, max_value: 0.2}, "
     "kind: {type: choice, values: [a]}}\nobjective: {goal: maximize, primary_metric: a}\n"
     "limits: {max_total_trials: 2}\nearly_termination: {type: median_stopping}\n",
     "early_termination: bayesian sampling does not support early termination"),
    ("sampling_algorithm: grid\nsearch_space: {lr: {type: uniform, min_value: 0.1, max_value: 0.2}, "
     "kind: {type: choice, values: [a]}}\nobjective: {goal: maximize, primary_metric: a}\nlimits: {max_total_trials: 2}\n",
     "sampling_algorithm"),
    ("sampling_algorithm: random\nsearch_space: {lr: {type: choice, values: [1]}, kind: {type: choice, values: [a]}}\n"
     "objective: {goal: maximize, primary_metric: a}\n", "limits: missing"),
])
def test_each_invalid_sweep_is_refused_in_one_line_naming_the_field(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_sweep(write_sweep(tmp_path, "inputs: {steps: 1}\n" + body))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_the_best_trial_and_the_trials_that_never_logged_the_primary_metric(tmp_path: Path) -> None:
    spec = load_sweep(write_sweep(tmp_path, """
        inputs: {steps: 3}
        sampling_algorithm: random
        search_space: {lr: {type: uniform, min_value: 0.1, max_value: 0.2}, kind: {type: choice, values: [a]}}
        objective: {goal: minimize, primary_metric: loss}
        limits: {max_total_trials: 4}
        """))
    done = RunStatus.COMPLETED
    trials = [Trial("s_0", {"lr": 0.1}, done, [0.9, 0.5]), Trial("s_1", {"lr": 0.2}, done, [0.7, 0.3]),
              Trial("s_2", {"lr": 0.15}, RunStatus.CANCELED, [0.8], reason="early termination: x"),
              Trial("s_3", {"lr": 0.12}, done, [], logged=["Loss", "acc"])]
    summary = results.summarize(spec, trials)
    assert (summary["best_child_run_id"], summary["score"]) == ("s_1", 0.3)  # the last report, the lowest
    assert summary["properties"]["best_child_run_id"] == "s_1" and summary["properties"]["score"] == "0.3"
    assert summary["properties"]["primary_metric_config"] == '{"name": "loss", "goal": "minimize"}'
    assert summary["notes"] == ["trial s_3 completed without logging the primary metric 'loss' (it logged: Loss, acc); "
                                "log it under that exact name, e.g. mlflow.log_metric('loss', value)"]
    assert [t["reason"] for t in summary["trials"]][2] == "early termination: x"


def test_job_validate_checks_a_sweep_and_its_trial_against_the_workspace(tmp_path: Path, home: Path) -> None:
    path = write_sweep(tmp_path, """
        inputs: {steps: 1}
        sampling_algorithm: grid
        search_space: {lr: {type: choice, values: [0.1]}, kind: {type: choice, values: [good]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 2}
        """)
    env = {"AMLEMU_HOME": str(home)}
    missing = CliRunner().invoke(cli, ["job", "validate", "-f", str(path)], env=env)
    assert missing.exit_code == 1 and "error: compute: 'c1' does not exist in the workspace" in missing.output
    assert CliRunner().invoke(cli, ["compute", "create", "-n", "c1", "--backend", "process"], env=env).exit_code == 0
    ok = CliRunner().invoke(cli, ["job", "validate", "-f", str(path)], env=env)
    assert ok.exit_code == 0 and "0 error(s)" in ok.output, ok.output
    path.write_text(path.read_text().replace("grid", "bayesian\nearly_termination: {type: median_stopping}"))
    refused = CliRunner().invoke(cli, ["job", "validate", "-f", str(path)], env=env)
    assert refused.exit_code == 1 and "early_termination: bayesian sampling does not support" in refused.output


# --- live sweeps -----------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=FULL)], indirect=True)
def test_a_sweep_of_2_node_mpi_trials_runs_each_as_a_child_job_and_names_the_best(emu: Emulator, cluster,
                                                                                  tmp_path: Path) -> None:
    cluster(max_nodes=4)
    path = write_sweep(tmp_path, """
          distribution: {type: mpi, process_count_per_instance: 1}
          resources: {instance_count: 2}
        inputs: {steps: 2}
        sampling_algorithm: {type: random, seed: 7}
        search_space:
          lr: {type: quniform, min_value: 0.0, max_value: 0.5, q: 0.1}
          kind: {type: choice, values: [good]}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 2, max_concurrent_trials: 2}
        """)
    created = CliRunner().invoke(cli, ["job", "create", "-f", str(path), "-o", "json"],  # as a user submits it
                                 env={"AMLEMU_HOME": str(emu.home.root)})
    assert created.exit_code == 0, created.output
    sweep = emu.run(json.loads(created.stdout)["name"])
    assert sweep.wait(timeout=STARTUP) is RunStatus.COMPLETED, sweep.record.error
    trials = emu.runs(parent=sweep.id)
    assert [t.id for t in trials] == [f"{sweep.id}_{n}" for n in range(2)]
    assert all(t.status is RunStatus.COMPLETED and len(t.record.nodes) == 2 for t in trials)  # 2-node MPI trials
    summary = results.read(sweep.dir)
    assert summary is not None
    scores = {t["name"]: t["metric"] for t in summary["trials"]}
    assert summary["best_child_run_id"] == max(scores, key=scores.get)  # type: ignore[arg-type]
    lrs = [t["values"]["lr"] for t in summary["trials"]]
    assert all(round(lr * 10) == lr * 10 for lr in lrs)  # quniform's q
    assert all(f"--lr {lr}" in t.job.command for t, lr in zip(trials, lrs))
    listed = CliRunner().invoke(cli, ["job", "list", "--parent-job-name", sweep.id, "-o", "json"],
                                env={"AMLEMU_HOME": str(emu.home.root)})
    assert listed.exit_code == 0 and sweep.id + "_1" in listed.output and f'"{sweep.id}"' not in listed.output
    shown = CliRunner().invoke(cli, ["job", "show", sweep.id], env={"AMLEMU_HOME": str(emu.home.root)})
    assert f"best {summary['best_child_run_id']} with accuracy" in shown.output  # below its trials table
    log = (sweep.dir / "azureml-logs" / "hyperdrive.txt").read_text()
    assert f"[SCHEDULER][INFO]Scheduling job, id='{sweep.id}_1'" in log


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_the_bandit_policy_cancels_the_trial_that_falls_behind_and_says_why(emu: Emulator, cluster,
                                                                            tmp_path: Path) -> None:
    cluster()
    path = write_sweep(tmp_path, """
        inputs: {steps: 200}
        sampling_algorithm: grid
        search_space: {lr: {type: choice, values: [0.0]}, kind: {type: choice, values: [good, bad]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 2, max_concurrent_trials: 2}
        early_termination: {type: bandit, slack_factor: 0.1, evaluation_interval: 1, delay_evaluation: 2}
        """, pause=0.25)
    sweep = emu.submit(path)
    assert sweep.wait(timeout=STARTUP) is RunStatus.COMPLETED, sweep.record.error
    good, bad = emu.runs(parent=sweep.id)
    assert (good.status, bad.status) == (RunStatus.COMPLETED, RunStatus.CANCELED)
    reason = results.read(sweep.dir)["trials"][1]["reason"]  # type: ignore[index]
    assert reason.startswith("early termination: bandit: best 0.9") and "slack factor 0.1" in reason
    assert any(reason in detail for _, _, detail in bad.events()), bad.events()  # the trial's own history says it
    assert results.read(sweep.dir)["best_child_run_id"] == good.id  # type: ignore[index]


def first_trial_running(emu: Emulator, sweep: Run) -> Run:
    """The sweep, once its first trial runs (a deadline, not a wait)."""
    first, deadline = f"{sweep.id}_0", time.monotonic() + STARTUP
    while not (emu.store.run_exists(first) and emu.store.run(first).status is RunStatus.RUNNING):
        assert not sweep.status.is_terminal and time.monotonic() < deadline, sweep.record.error
        time.sleep(0.1)
    return sweep


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_canceled_sweep_or_one_whose_driver_died_ends_its_trials_and_a_missing_metric_is_reported(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    cluster()
    path = write_sweep(tmp_path, """
        inputs: {steps: 1}
        sampling_algorithm: grid
        search_space: {lr: {type: choice, values: [0.1, 0.2, 0.3]}, kind: {type: choice, values: [silent]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 10, max_concurrent_trials: 3}
        """)
    sweep = emu.submit(path)
    assert sweep.wait(timeout=STARTUP) is RunStatus.COMPLETED, sweep.record.error
    summary = results.read(sweep.dir)
    assert summary is not None and len(summary["trials"]) == 3  # grid: the product, then it stops
    assert summary["best_child_run_id"] is None and summary["properties"]["best_metric_status"] == "Failed"
    assert "the primary metric 'accuracy' (it logged: no metric at all)" in summary["notes"][0]
    assert "exhausted after 3 trial(s)" in (sweep.dir / "azureml-logs" / "hyperdrive.txt").read_text()

    slow = write_sweep(tmp_path / "slow", """
        inputs: {steps: 600}
        sampling_algorithm: {type: random, seed: 1}
        search_space: {lr: {type: uniform, min_value: 0.1, max_value: 0.2}, kind: {type: choice, values: [silent]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 5, max_concurrent_trials: 2}
        """, pause=0.1)
    running = first_trial_running(emu, emu.submit(slow))
    emu.cancel(running.id)
    assert running.wait(timeout=STARTUP) is RunStatus.CANCELED
    assert {t.wait(timeout=STARTUP) for t in emu.runs(parent=running.id)} == {RunStatus.CANCELED}

    at_once = emu.submit(slow)  # canceled as it is queued (or as its first trials start): the same end
    emu.cancel(at_once.id)
    assert at_once.wait(timeout=STARTUP) is RunStatus.CANCELED
    assert {t.wait(timeout=STARTUP) for t in emu.runs(parent=at_once.id)} <= {RunStatus.CANCELED}

    orphan = first_trial_running(emu, emu.submit(slow))  # its driver killed: the next look at the home ends it
    os.kill(orphan.record.supervisor_pid, signal.SIGKILL)  # the driver this test started, by its pid
    deadline = time.monotonic() + STARTUP
    while not emu.reconcile() and time.monotonic() < deadline:  # the pid may linger a moment as a zombie
        time.sleep(0.1)
    assert orphan.status is RunStatus.FAILED and "supervising this run died" in (orphan.record.error or "")
    assert {t.wait(timeout=STARTUP) for t in emu.runs(parent=orphan.id)} == {RunStatus.CANCELED}


EXAMPLE = REPO / "examples" / "sweep_mnist.yml"


def test_the_examples_sweep_tunes_the_seed_trainer_on_two_nodes() -> None:
    spec = load_sweep(EXAMPLE)
    job = trial_job(spec, {"lr": 0.01, "batch_size": 32}, "mnist_0", code=None)
    assert (job.instance_count, job.distribution.type.value, job.code) == (2, "mpi", REPO / "trainer")
    assert "--lr 0.01 --batch-size 32" in job.command and spec.objective.primary_metric == "test_accuracy"
    assert spec.limits.concurrency == 1 and spec.early_termination is not None


@TRAINING
@FULL
@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_the_examples_sweep_runs_as_a_user_would_run_it(emu: Emulator, mnist_subset: Path) -> None:
    emu.create_compute(ClusterSpec("cpu-cluster", "STANDARD_D2_V2", max_nodes=2))
    emu.datastores.upload(mnist_subset, "azureml://datastores/workspaceblobstore/paths/mnist")
    sweep = emu.submit(EXAMPLE, overrides=["inputs.max_steps=20", "limits.max_total_trials=2"])
    assert sweep.wait(timeout=900) is RunStatus.COMPLETED, sweep.record.error
    summary = results.read(sweep.dir)
    assert summary is not None and summary["best_child_run_id"] in {t.id for t in emu.runs(parent=sweep.id)}
    assert all(t["metric"] is not None for t in summary["trials"] if t["status"] == "Completed")


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_sweep_whose_trials_cannot_fit_in_memory_is_refused_before_anything_is_made(emu: Emulator, cluster,
                                                                                      tmp_path: Path) -> None:
    cluster()
    path = write_sweep(tmp_path, """
        inputs: {steps: 1}
        sampling_algorithm: grid
        search_space: {lr: {type: choice, values: [0.1, 0.2]}, kind: {type: choice, values: [good]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 2}
        """)
    spec = load_sweep(path)  # this trial measured before at more memory per rank than this machine has
    key = memwatch.figure_key(trial_job(spec, {"lr": 0.1, "kind": "good"}, "t", code=None))
    memwatch.record(emu.home.root, key, memwatch.RankMemory(psutil.virtual_memory().total, "big_run", 1))
    with pytest.raises(ConfigError) as refused:
        emu.submit(path)
    assert str(refused.value).startswith("trial.resources.instance_count: 1 ranks need about")
    assert "not one such rank fits" in str(refused.value) and emu.runs() == []


@FULL
@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_limits_timeout_ends_the_sweep_and_cancels_its_active_trials(emu: Emulator, cluster, tmp_path: Path) -> None:
    """az ml's shortest sweep timeout is 60 s (a shorter one is raised to it): make test-full."""
    cluster()
    path = write_sweep(tmp_path, """
        inputs: {steps: 3000}
        sampling_algorithm: {type: random, seed: 3}
        search_space: {lr: {type: uniform, min_value: 0.1, max_value: 0.2}, kind: {type: choice, values: [silent]}}
        objective: {goal: maximize, primary_metric: accuracy}
        limits: {max_total_trials: 4, max_concurrent_trials: 2, timeout: 60}
        """, pause=0.1)
    started = time.monotonic()
    sweep = emu.submit(path)
    assert sweep.wait(timeout=300) is RunStatus.FAILED  # no trial completed before the limit
    assert 60 <= time.monotonic() - started < 200
    summary = results.read(sweep.dir)
    assert summary is not None and {t["status"] for t in summary["trials"]} == {"Canceled"}
    assert all(t["reason"] == "the sweep stopped: limits.timeout (60 s) reached" for t in summary["trials"])
