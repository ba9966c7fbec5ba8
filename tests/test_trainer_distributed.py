"""The trainer with 2 ranks under the platform's mpirun, as a node runs it (Horovod is built with MPI
alone: AmlCompute launches it with mpirun, never with Gloo)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from conftest import FULL, TRAINER_DIR, TRAINING

from amlemu.home import default_cache
from amlemu.runs.metrics import seed_store
from amlemu.runs.mpi import MpiLaunch, launch_env, mpirun_argv

pytestmark = pytest.mark.slow

FAST = ["--epochs", "2", "--max-steps", "15", "--log-interval", "5", "--test-batch-size", "250"]


def _trainer(data: Path, *extra: str) -> list[str]:
    return [sys.executable, str(TRAINER_DIR / "train.py"), "--data-dir", str(data), *extra]


def _run(argv: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"exit {done.returncode}\n--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
    return done


def _tracking(tmp_path: Path) -> dict[str, str]:
    """An MLflow store holding one run for the job, as a node's (MLFLOW_RUN_ID attaches rank 0 to it):
    copied from the emulator's seeded template, not made by MLflow's migrations (seconds each)."""
    template = default_cache() / "mlflow" / f"seed-{version('mlflow')}.db"
    seed_store(tmp_path / "mlflow.db", "trainer", "trainer_run", "trainer_run", template)
    return {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}", "MLFLOW_RUN_ID": "trainer_run"}


def _mpirun(cwd: Path, program: list[str], tracking: dict[str, str]) -> subprocess.CompletedProcess:
    launch = MpiLaunch(program=program, nprocs=2, env=tracking, as_root=os.geteuid() == 0)
    return _run(mpirun_argv(launch), cwd, launch_env(launch))


def _metrics(tracking: dict[str, str]) -> dict[str, list[tuple[int, float]]]:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    client = MlflowClient(tracking_uri=tracking["MLFLOW_TRACKING_URI"])
    runs = client.search_runs(experiment_ids=[e.experiment_id for e in client.search_experiments()])
    assert [r.info.run_id for r in runs] == [tracking["MLFLOW_RUN_ID"]], "rank 0 alone logs, to the job's run"
    return {name: sorted((m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, name))
            for name in runs[0].data.metrics}


def _assert_trained(cwd: Path, summary_steps: int) -> dict:
    outputs = cwd / "outputs"
    summary = json.loads((outputs / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert len(summary["param_digests"]) == 2 and summary["params_in_sync"] is True
    assert summary["param_digests"][0] == summary["param_digests"][1]
    assert summary["global_step"] == summary_steps
    assert {p.name for p in outputs.iterdir()} >= {"model.pt", "summary.json",
                                                  "checkpoint-epoch1.pt", "checkpoint-epoch2.pt"}
    return summary


@TRAINING
@FULL  # `make test` checks the same contract on emulated nodes (test_cluster's Horovod MNIST)
def test_two_ranks_under_mpirun(tmp_path: Path, mnist_subset: Path) -> None:
    """The trainer outside the emulator, under a bare mpirun (bench/'s baseline): --max-steps, the
    loss every --log-interval steps, rank 0 alone logging to the job's MLflow run. (A restart
    resuming from its newest checkpoint: test_faults' preemption of the seed's job.)"""
    tracking = _tracking(tmp_path)
    done = _mpirun(tmp_path, _trainer(mnist_subset, *FAST), tracking)
    summary = _assert_trained(tmp_path, summary_steps=30)
    assert 0.0 < summary["test_accuracy"] <= 1.0 and summary["resumed_from"] is None
    assert "parameters identical on all 2 ranks: True" in done.stdout
    metrics = _metrics(tracking)
    assert [step for step, _ in metrics["test_accuracy"]] == [1, 2]
    assert metrics["test_accuracy"][-1][1] == pytest.approx(summary["test_accuracy"])
    assert [step for step, _ in metrics["train_loss"]] == [1, 6, 11, 16, 21, 26]
