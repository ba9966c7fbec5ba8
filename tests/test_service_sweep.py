"""Sweep jobs through `amlemu serve` (issue 28): the REST body azure-ai-ml makes of
`command(...).sweep(...)` becomes the `type: sweep` YAML the emulator reads (pure, no network), and
the unchanged SDK against the in-process service on process nodes: create_or_update, stream, get
(best child and score in the sweep's properties), jobs.list(parent_job_name=...), get of a trial,
begin_cancel of a sweep and its trials, and a bad body's one-line 400 naming the field."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import wait_until
from test_service import WS, live  # noqa: F401 - the in-process service fixture

from amlemu.errors import ConfigError
from amlemu.service.state import ServiceError, sweeprest
from amlemu.sweeps.sweepspec import sweep_from_dict

CODE_ID = f"{WS}/codes/c0de/versions/1"
TRAIN = """
import argparse, mlflow
p = argparse.ArgumentParser(); p.add_argument("--lr", type=float); p.add_argument("--a", type=int)
a = p.parse_args()
for step in range(2):
    mlflow.log_metric("accuracy", a.lr * a.a + step, step=step)
open("outputs/lr.txt", "w").write(str(a.lr))
print("trained", a.lr, flush=True)
"""


def _sweep(code: str, **limits: Any) -> Any:
    from azure.ai.ml import command  # noqa: PLC0415
    from azure.ai.ml.sweep import BanditPolicy, Choice  # noqa: PLC0415

    trial = command(code=code, command="python train.py --lr ${{inputs.lr}} --a ${{inputs.a}}",
                    inputs={"lr": 0.1, "a": 2}, environment="azureml:AzureML-sklearn-1.5@latest", compute="c1")
    sweep = trial(lr=Choice([0.1, 0.3, 0.2])).sweep(
        compute="c1", sampling_algorithm="grid", primary_metric="accuracy", goal="Maximize",
        early_termination_policy=BanditPolicy(slack_factor=0.5, evaluation_interval=1, delay_evaluation=5))
    sweep.set_limits(**{"max_total_trials": 3, "max_concurrent_trials": 2, "timeout": 600, **limits})
    sweep.experiment_name = "sweeps"
    return sweep


def _body(tmp_path: Path) -> dict[str, Any]:
    """What create_or_update PUTs, its code uploaded (the SDK then sends the code asset's id)."""
    body = _sweep(str(tmp_path))._to_job()._to_rest_object().as_dict()
    body["properties"]["trial"]["codeId"] = CODE_ID
    return body


def _to_yaml(body: dict[str, Any], code: Path) -> dict[str, Any]:
    return sweeprest.to_yaml("sw1", body, lambda name, version: code, lambda env: env)


def test_the_sdks_sweep_body_becomes_the_sweep_yaml(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    body = _body(tmp_path)
    assert body["properties"]["searchSpace"] == {"lr": ["choice", [[0.1, 0.3, 0.2]]]}  # the REST shape, as sent
    data = _to_yaml(body, tmp_path)
    assert data == {
        "type": "sweep", "name": "sw1", "compute": "c1", "experiment_name": "sweeps", "inputs": {"a": "2"},
        "trial": {"command": "python train.py --lr ${{search_space.lr}} --a ${{inputs.a}}", "code": str(tmp_path),
                  "environment": "azureml:AzureML-sklearn-1.5@latest"},
        "search_space": {"lr": {"type": "choice", "values": [0.1, 0.3, 0.2]}}, "sampling_algorithm": "grid",
        "objective": {"goal": "maximize", "primary_metric": "accuracy"},
        "limits": {"max_total_trials": 3, "max_concurrent_trials": 2, "timeout": 600},
        "early_termination": {"type": "bandit", "slack_factor": 0.5, "evaluation_interval": 1, "delay_evaluation": 5}}
    spec = sweep_from_dict(data, base_dir=tmp_path)  # the sweep the CLI would read from that YAML
    assert (spec.sampling.type, spec.limits.max_total_trials, spec.compute) == ("grid", 3, "c1")


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p.pop("trial"), r"^trial: missing"),
    (lambda p: p.pop("objective"), r"^objective: missing"),
    (lambda p: p.update(searchSpace={"lr": ["uniform", [0.1]]}), r"searchSpace\.lr"),
    (lambda p: p.update(samplingAlgorithm={"samplingAlgorithmType": "Annealing"}),
     r"samplingAlgorithm\.samplingAlgorithmType: unknown sampling algorithm 'Annealing'"),
    (lambda p: p.update(samplingAlgorithm={"samplingAlgorithmType": "Bayesian"}),
     r"^early_termination: bayesian sampling does not support early termination"),
    (lambda p: p["limits"].update(maxTotalTrials="many"), r"^limits\.maxTotalTrials"),
    (lambda p: p["trial"].update(codeId="somewhere"), r"^code: 'somewhere' is not a code asset id"),
])
def test_a_bad_sweep_body_is_refused_in_one_line_naming_the_field(tmp_path: Path, change: Any, message: str) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    body = _body(tmp_path)
    change(body["properties"])
    with pytest.raises((ServiceError, ConfigError), match=message) as err:
        sweep_from_dict(_to_yaml(body, tmp_path), base_dir=tmp_path)
    assert "\n" not in str(err.value)


def test_a_cli_sweeps_record_reads_back_as_a_sweep_job() -> None:
    """A sweep submitted with `amlemu job create` (no body PUT): its trial template's command job props
    become the Sweep shape, with the results' properties."""
    yaml = {"type": "sweep", "trial": {"command": "python t.py --lr ${{search_space.lr}}", "environment": "img"},
            "search_space": {"lr": {"type": "uniform", "min_value": 0.1, "max_value": 0.2}},
            "sampling_algorithm": {"type": "random", "seed": 3}, "objective": {"goal": "minimize", "primary_metric": "loss"},
            "limits": {"max_total_trials": 2}}
    command = {"jobType": "Command", "command": "python t.py --lr 0", "environmentId": "img", "computeId": "c",
               "status": "Completed", "properties": {}, "limits": {"timeout": "PT1S"}}
    props = sweeprest.sweep_properties(command, yaml, {"properties": {"best_child_run_id": "s_1", "score": 0.5}})
    assert props["jobType"] == "Sweep" and props["trial"]["command"] == yaml["trial"]["command"]
    assert props["searchSpace"] == {"lr": ["uniform", [0.1, 0.2]]} and props["computeId"] == "c"
    assert props["samplingAlgorithm"]["samplingAlgorithmType"] == "Random"
    assert props["objective"] == {"goal": "Minimize", "primaryMetric": "loss"}
    assert props["limits"]["maxTotalTrials"] == 2 and "earlyTermination" not in props
    assert props["properties"] == {"best_child_run_id": "s_1", "score": "0.5"}


def test_azure_ai_ml_sweeps_through_the_service(live, tmp_path: Path) -> None:  # noqa: F811
    from azure.ai.ml import MLClient  # noqa: PLC0415
    from azure.ai.ml.entities import AmlCompute  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    url, bearer, ca = live
    code = tmp_path / "src"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    ml_client.compute.begin_create_or_update(AmlCompute(name="c1", size="STANDARD_D2_V2", max_instances=2,
                                                        idle_time_before_scale_down=120)).result()
    sweep = ml_client.jobs.create_or_update(_sweep(str(code)))
    assert type(sweep).__name__ == "SweepJob" and sweep.status in ("Queued", "Preparing", "Running")
    ml_client.jobs.stream(sweep.name)  # ends with the sweep

    done = ml_client.jobs.get(sweep.name)
    trials = [f"{sweep.name}_{n}" for n in range(3)]  # grid: lr 0.1, 0.3, 0.2 in order; accuracy 2 lr + 1
    assert type(done).__name__ == "SweepJob" and done.status == "Completed"
    assert (done.properties["best_child_run_id"], float(done.properties["score"])) == (trials[1], 1.6)
    assert json.loads(done.properties["primary_metric_config"]) == {"name": "accuracy", "goal": "maximize"}
    assert done.sampling_algorithm.type == "grid" and done.early_termination.slack_factor == 0.5
    children = list(ml_client.jobs.list(parent_job_name=sweep.name))
    assert [(c.name, c.status) for c in children] == [(t, "Completed") for t in trials]
    assert json.loads(children[1].properties["hyperparameters"]) == {"lr": 0.3}
    assert [j.name for j in ml_client.jobs.list()] == [sweep.name]  # the trials are the sweep's, not listed
    trial = ml_client.jobs.get(trials[2])
    assert (trial.status, trial.compute) == ("Completed", "c1") and "--lr 0.2 --a" in trial.command
    ml_client.jobs.download(sweep.name, download_path=tmp_path / "dl", all=True)  # the best trial's, as az ml
    assert (tmp_path / "dl" / "artifacts" / "outputs" / "lr.txt").read_text() == "0.3"
    assert "Scheduling job" in (tmp_path / "dl" / "hd-artifacts" / "azureml-logs" / "hyperdrive.txt").read_text()

    # A sweep canceled while its trials run: the sweep and every trial end Canceled.
    slow = _sweep(str(code), max_total_trials=2)
    slow.trial.command = "python -c 'import time; time.sleep(120)' ${{search_space.lr}}"
    slow = ml_client.jobs.create_or_update(slow)
    wait_until(lambda: any(c.status == "Running" for c in ml_client.jobs.list(parent_job_name=slow.name)),
               60, "a trial runs")
    ml_client.jobs.begin_cancel(slow.name).result()
    wait_until(lambda: ml_client.jobs.get(slow.name).status == "Canceled", 60, "the sweep is canceled")
    assert {c.status for c in ml_client.jobs.list(parent_job_name=slow.name)} == {"Canceled"}

    # A body no SDK would send: Azure's 400, one line naming the field.
    body = _body(tmp_path)
    body["properties"]["searchSpace"] = {"lr": ["uniform", [0.1]]}
    reply = requests.put(f"{url}{WS}/jobs/bad-sweep", json=body, headers=bearer, verify=ca,
                         params={"api-version": "2024-04-01"}, timeout=30)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["message"].startswith("searchSpace.lr") and "\n" not in error["message"]
