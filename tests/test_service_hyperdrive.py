"""SDK v1 HyperDrive through `amlemu serve` (issue 28): `Experiment.submit(HyperDriveConfig(...))` with
unchanged azureml-core code becomes a sweep whose trials are child runs; HyperDriveRun reads its
children, best run and hyperparameters back and cancels it. Unit tests of the config -> sweep YAML
conversion (state/hyperdriverest.py) and of the snapshot store (state/v1snapshots.py); one end-to-end
run of a user's script, as its own process with `amlemu env`'s variables, on process nodes."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import served
from test_service import WS, live  # noqa: F401 - the in-process service fixture

from amlemu.errors import ConfigError
from amlemu.home import Home
from amlemu.service.state import DiskBlobs, ServiceError, hyperdriverest
from amlemu.service.state.v1snapshots import Snapshots
from amlemu.sweeps.sweepspec import sweep_from_dict

COMMAND_JOB = {"type": "command", "experiment_name": "hd", "code": "/src", "command": "python train.py --base 2",
               "environment": {"image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04"},
               "compute": "azureml:cpucluster", "resources": {"instance_count": 1}}


def _config(**changes: Any) -> dict[str, Any]:
    """A config as azureml-core's HyperDriveConfig serializes it (CreateExperimentDto)."""
    config = {"generator_config": {"name": "RANDOM", "parameter_space": {
        "--lr": ["choice", [[0.1, 0.2]]], "--batch-size": ["uniform", [16, 64]]}, "properties": {"seed": 3}},
        "policy_config": {"name": "Bandit", "properties": {"evaluation_interval": 1, "delay_evaluation": 0,
                                                           "slack_factor": 0.1}},
        "primary_metric_config": {"name": "accuracy", "goal": "maximize"}, "max_total_jobs": 4,
        "max_concurrent_jobs": 2, "max_duration_minutes": 10080, "platform": "AML",
        "platform_config": {"Definition": {"Overrides": {"script": "train.py"}, "SnapshotId": "s1"}}}
    return {**config, **changes}


def test_a_v1_config_becomes_the_sweep_yaml_with_the_arguments_appended(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    data = hyperdriverest.to_yaml("HD_1", _config(), {**COMMAND_JOB, "code": str(tmp_path)})

    assert data["trial"]["command"] == \
        "python train.py --base 2 --lr ${{search_space.lr}} --batch-size ${{search_space.batch_size}}"
    assert data["search_space"] == {"lr": {"type": "choice", "values": [0.1, 0.2]},
                                    "batch_size": {"type": "uniform", "min_value": 16, "max_value": 64}}
    assert data["sampling_algorithm"] == {"type": "random", "seed": 3}
    assert data["objective"] == {"goal": "maximize", "primary_metric": "accuracy"}
    assert data["limits"] == {"max_total_trials": 4, "max_concurrent_trials": 2, "timeout": 604800}
    assert data["early_termination"]["type"] == "bandit" and data["early_termination"]["slack_factor"] == 0.1
    assert (data["compute"], data["experiment_name"]) == ("azureml:cpucluster", "hd")
    spec = sweep_from_dict(data, base_dir=tmp_path)  # what the sweep's submit reads
    assert spec.template is not None and spec.template.command == "python train.py --base 2 --lr 0 --batch-size 0"
    grid = hyperdriverest.to_yaml("HD_2", _config(generator_config={"name": "GRID", "parameter_space": {
        "lr": ["choice", [[1, 2]]]}}, policy_config={"name": "Default"}), COMMAND_JOB)
    assert grid["sampling_algorithm"] == "grid" and "early_termination" not in grid
    bayes = hyperdriverest.to_yaml("HD_3", _config(generator_config={"name": "BayesianOptimization", "parameter_space": {
        "lr": ["choice", [[1, 2]]]}}, policy_config={"name": "Default"}), COMMAND_JOB)
    assert bayes["sampling_algorithm"] == "bayesian"


def test_v1_names_become_unique_identifiers() -> None:
    assert hyperdriverest.param_names({"--lr": 0, "lr": 0, "-x.y": 0, "--2nd": 0, "--": 0}) == \
        {"--lr": "lr", "lr": "lr_2", "-x.y": "x_y", "--2nd": "p_2nd", "--": "param"}


@pytest.mark.parametrize("changes, field", [
    ({"generator_config": {"name": "HALTON", "parameter_space": {"a": ["choice", [[1]]]}}}, "generator_config.name"),
    ({"generator_config": {"name": "RANDOM", "parameter_space": {"--a": ["uniform", [1]]}}},
     "generator_config.parameter_space.--a[1]"),
    ({"policy_config": {"name": "Bandit", "properties": {"slack_factor": -1}}}, "policy_config.properties.slack_factor"),
    ({"max_total_jobs": 0}, "max_total_runs"),
    ({"primary_metric_config": {"name": "acc"}}, "primary_metric_config"),
    ({"resume_from": [{"run_id": "HD_0"}]}, "resume_from"),
])
def test_a_bad_config_is_refused_naming_the_v1_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        hyperdriverest.to_yaml("HD_1", _config(**changes), COMMAND_JOB)
    assert err.value.field == field


def test_the_parent_tags_carry_each_trials_hyperparameters_under_their_v1_names() -> None:
    trials = [{"name": "HD_1_0", "values": {"lr": 0.1, "batch_size": 20.5}}, {"name": "other_1", "values": {}}]
    tags = hyperdriverest.parent_tags("HD_1", _config(), trials)
    assert json.loads(tags["_aml_system_HD_1_0"]) == {"--lr": 0.1, "--batch-size": 20.5}
    assert "_aml_system_other_1" not in tags
    assert json.loads(tags["generator_config"])["name"] == "RANDOM" and tags["max_total_jobs"] == "4"
    reply = hyperdriverest.response("HD_1", "hd", _config())
    assert reply["result"]["platform_config"]["ParentRunId"] == "HD_1"


def test_a_snapshot_is_its_uploads_and_its_parents_other_files(tmp_path: Path) -> None:
    blobs = DiskBlobs(tmp_path / "blobs")
    snaps = Snapshots(tmp_path / "snapshots", blobs)

    def node(**children: Any) -> dict[str, Any]:
        return {"type": "Directory", "children": {k: v or {"type": "File"} for k, v in children.items()}}

    def upload(container: str, **files: bytes) -> list[dict[str, str]]:
        for i, data in enumerate(files.values()):
            blobs.put(container, f"f{i}", data, None)
        return [{"FullName": name, "BlobUri": f"https://amlemu.blob.x@127.0.0.1:1/amlemustore/{container}/f{i}?sig=1"}
                for i, name in enumerate(files)]

    first = upload("snapshot-a", **{"train.py": b"v1", "lib/util.py": b"u"})
    snaps.create("s1", {"DirTreeNode": node(**{"train.py": None, "lib": node(**{"util.py": None})}),
                        "FileRevisionList": {"FileNodes": first}})
    # The next snapshot: train.py changed (uploaded), lib/util.py not (the parent's), old.py gone.
    changed = upload("snapshot-b", **{"train.py": b"v2"})
    snaps.create("s2", {"ParentSnapshotId": "s1", "DirTreeNode": node(**{"train.py": None, "lib": node(**{
        "util.py": None})}), "FileRevisionList": {"FileNodes": changed}})

    s2 = snaps.folder("s2")
    assert sorted(str(p.relative_to(s2)) for p in s2.rglob("*")) == ["lib", "lib/util.py", "train.py"]
    assert ((s2 / "train.py").read_bytes(), (s2 / "lib" / "util.py").read_bytes()) == (b"v2", b"u")
    assert (snaps.folder("s1") / "train.py").read_bytes() == b"v1"
    assert not list((tmp_path / "blobs").iterdir())  # the uploads, once copied
    for body, field in [({"ParentSnapshotId": "gone", "DirTreeNode": node(**{"a.py": None})}, "ParentSnapshotId"),
                        ({"DirTreeNode": node(**{"..": None})}, "DirTreeNode"),
                        ({"DirTreeNode": node(**{"a.py": None}), "FileRevisionList": {"FileNodes": [
                            {"FullName": "a.py", "BlobUri": "https://h/amlemustore/code-x/a.py"}]}}, "FileRevisionList")]:
        with pytest.raises(ServiceError) as err:
            snaps.create("s3", body)
        assert err.value.target == field
    assert not (tmp_path / "snapshots" / "s3").exists()


TRAIN = """
import argparse, time
from azureml.core import Run
parser = argparse.ArgumentParser()
parser.add_argument("--base", type=float)
parser.add_argument("--lr", type=float)
parser.add_argument("--sleep", type=float, default=0)
args = parser.parse_args()
run = Run.get_context()
run.log("accuracy", args.base * args.lr)
time.sleep(args.sleep)
"""

USER_SCRIPT = """
import json, sys, time
from azureml.core import Experiment, ScriptRunConfig, Workspace
from azureml.core.compute import AmlCompute, ComputeTarget
from azureml.train.hyperdrive import (BanditPolicy, HyperDriveConfig, PrimaryMetricGoal,
                                      RandomParameterSampling, choice)

ws = Workspace.from_config()
target = ComputeTarget.create(ws, "cpucluster", AmlCompute.provisioning_configuration(vm_size="STANDARD_D2_V2",
                                                                                      max_nodes=4))
target.wait_for_completion()

def sweep(*arguments, total=3):
    src = ScriptRunConfig(source_directory=sys.argv[1], script="train.py", arguments=list(arguments),
                          compute_target=target)
    return HyperDriveConfig(run_config=src, hyperparameter_sampling=RandomParameterSampling({"--lr": choice(1, 2, 3)},
                                                                                    properties={"seed": 7}),
                            policy=BanditPolicy(slack_factor=0.1, evaluation_interval=1, delay_evaluation=5),
                            primary_metric_name="accuracy", primary_metric_goal=PrimaryMetricGoal.MAXIMIZE,
                            max_total_runs=total, max_concurrent_runs=3)

experiment = Experiment(ws, "hd-exp")
slow = experiment.submit(sweep("--base", 1, "--sleep", 300, total=1))  # to cancel while the other runs
run = experiment.submit(sweep("--base", 2))
run.wait_for_completion()
best = run.get_best_run_by_primary_metric()
print("RESULT " + json.dumps({
    "id": run.id, "type": type(run).__name__, "status": run.get_status(), "run_type": run.type,
    "details": run.get_details()["status"], "children": sorted((c.id, c.get_status()) for c in run.get_children()),
    "best": best.id, "best_metrics": best.get_metrics(), "best_files": best.get_file_names(),
    "hyperparameters": run.get_hyperparameters()}), flush=True)

deadline = time.time() + 120
while not any(c.get_status() == "Running" for c in slow.get_children()) and time.time() < deadline:
    time.sleep(0.2)
slow.cancel()
while slow.get_status() not in ("Canceled", "Failed", "Completed") and time.time() < deadline:
    time.sleep(0.2)
print("CANCELED " + json.dumps({"status": slow.get_status(),
                                "children": sorted(c.get_status() for c in slow.get_children())}), flush=True)
"""


def test_a_hyperdrive_config_sweeps_through_the_service_from_unchanged_azureml_core(tmp_path: Path,
                                                                                  _homes: set[str]) -> None:
    home, project, user, src = (tmp_path / d for d in ("home", "project", "user", "src"))
    for folder in (home, project, user, src):
        folder.mkdir()
    (src / "train.py").write_text(TRAIN)
    (tmp_path / "user_script.py").write_text(USER_SCRIPT)
    _homes.add(Home.at(home).id)
    with served(home, project, backend="process") as env:
        base = {k: os.environ[k] for k in ("PATH", "LANG", "PYTHONPATH") if k in os.environ}
        done = subprocess.run([sys.executable, str(tmp_path / "user_script.py"), str(src)], cwd=project,
                              env={**base, "HOME": str(user), **env}, capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads(re.search(r"^RESULT (.*)$", done.stdout, re.M)[1])
    parent = result["id"]
    assert parent.startswith("HD_") and (result["type"], result["status"]) == ("HyperDriveRun", "Completed")
    assert (result["run_type"], result["details"]) == ("hyperdrive", "Completed")
    assert result["children"] == [[f"{parent}_{n}", "Completed"] for n in range(3)]
    lrs = {run: json.loads(values)["--lr"] for run, values in result["hyperparameters"].items()}
    assert sorted(lrs) == [f"{parent}_{n}" for n in range(3)] and sorted(lrs.values()) == [1, 2, 3]  # seed 7's
    # The best trial is the one with the highest lr (accuracy = 2 * lr), with the metric it logged.
    assert lrs[result["best"]] == 3 and result["best_metrics"] == {"accuracy": 6.0}
    assert "azureml-logs/70_driver_log.txt" in result["best_files"]  # a v1 run's logs, as HyperDrive's trials have
    canceled = json.loads(re.search(r"^CANCELED (.*)$", done.stdout, re.M)[1])
    assert canceled["status"] == "Canceled" and set(canceled["children"]) == {"Canceled"}


def test_a_config_the_service_cannot_run_is_refused_in_one_line(live) -> None:  # noqa: F811
    url, bearer, ca = live
    runs = f"{url}/hyperdrive/v1.0{WS}/experiments/hd/runs"

    def post(config: dict[str, Any]) -> dict[str, Any]:
        reply = requests.post(runs, files={"config": ("config.json", json.dumps(config))}, headers=bearer, verify=ca,
                              timeout=30)
        assert reply.status_code == 400 and "\n" not in reply.json()["error"]["message"]
        return reply.json()["error"]

    assert post(_config())["target"] == "SnapshotId"  # no snapshot s1 was made here
    assert ".projectcontent" in post(_config())["message"]  # the client's cache names one: how to forget it
    assert post(_config(platform="AML_PIPELINES"))["target"] == "platform"
    missing = requests.post(runs, files={"other": ("x", b"{}")}, headers=bearer, verify=ca, timeout=30)
    assert missing.status_code == 400 and missing.json()["error"]["target"] == "config"
    cancel = requests.post(f"{runs}/HD_none/cancel", headers=bearer, verify=ca, timeout=30)
    assert cancel.status_code == 404
