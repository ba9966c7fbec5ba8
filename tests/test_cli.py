"""The `amlemu` command line: verbs, JSON output, one-line errors, state shared between processes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO

from amlemu.cli import cli


@pytest.fixture
def amlemu(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()  # an explicit --home must exist (only $AMLEMU_HOME and ~/.amlemu are created on first use)
    runner = CliRunner()

    def invoke(*args: str, code: int = 0) -> str:
        result = runner.invoke(cli, ["--home", str(home), *args])
        assert result.exit_code == code, result.output
        return result.output
    yield invoke
    runner.invoke(cli, ["--home", str(home), "cleanup", "--yes"])


def test_workspace_show_and_config_json(amlemu, tmp_path: Path) -> None:
    shown = json.loads(amlemu("workspace", "show", "-o", "json"))
    assert shown["workspace_name"] == "amlemu-ws" and shown["home"].endswith("home")
    amlemu("workspace", "set", "--name", "my-ws", "--resource-group", "rg1")
    amlemu("workspace", "config", "--path", str(tmp_path / "config.json"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config == {"subscription_id": "00000000-0000-0000-0000-000000000000", "resource_group": "rg1",
                      "workspace_name": "my-ws"}


def test_compute_dry_run_creates_nothing(amlemu) -> None:
    out = amlemu("compute", "create", "-f", str(REPO / "trainer" / "compute.yml"), "--backend", "process",
                 "--dry-run")
    plan = json.loads(out[out.index("{"):])
    assert plan["compute"]["vm_size"] == "Standard_NC6" and plan["compute"]["vm_priority"] == "lowpriority"
    assert plan["backend"] == "process" and plan["nodes_now"] == []
    assert "scaled to this machine" in plan["notice"]
    assert json.loads(amlemu("compute", "list", "-o", "json")) == []


def test_compute_lifecycle(amlemu) -> None:
    amlemu("compute", "create", "--name", "c1", "--size", "standard_ds3_v2", "--max-instances", "3",
           "--min-instances", "1", "--tier", "low_priority", "--backend", "process")
    [listed] = json.loads(amlemu("compute", "list", "-o", "json"))
    assert (listed["name"], listed["vm_size"], listed["max_nodes"], listed["idle"]) == ("c1", "Standard_DS3_v2", 3, 1)
    assert "c1-node-0  idle" in amlemu("compute", "show", "c1")
    amlemu("compute", "delete", "c1", "--yes")
    assert json.loads(amlemu("compute", "list", "-o", "json")) == []


@pytest.mark.parametrize(("args", "message"), [
    (["compute", "create", "--name", "c1", "--size", "STANDARD_XL9"], "amlemu: error: vm_size: unknown size 'STANDARD_XL9'; use one of:"),
    (["compute", "create", "--name", "c1", "--min-instances", "3", "--max-instances", "2"],
     "amlemu: error: max_nodes: 2 is below min_nodes 3"),
    (["compute", "create", "--name", "c1", "--min-instances", "-1"], "amlemu: error: min_nodes: must be a non-negative"),
    (["compute", "show", "nope"], "amlemu: error: compute 'nope' not found; create it with `amlemu compute create`"),
    (["job", "show", "nope"], "amlemu: error: job 'nope' not found"),
    (["job", "create", "-f", "/nonexistent.yml"], "amlemu: error: -f: /nonexistent.yml does not exist"),
])
def test_bad_input_is_one_line_naming_the_field(amlemu, args, message) -> None:
    out = amlemu(*args, code=3 if args[1] == "show" else 1)  # az's ResourceNotFound on a show verb
    assert out.startswith(message) and out.count("\n") == 1, out


def test_job_dry_run_prints_the_launch(amlemu, mnist_subset: Path) -> None:
    amlemu("compute", "create", "-f", str(REPO / "trainer" / "compute.yml"), "--backend", "process")
    out = amlemu("job", "create", "-f", str(REPO / "trainer" / "job.yml"), "--dry-run",
                 "--set", f"inputs.data_dir.path={mnist_subset}")
    plan = json.loads(out)
    # Process nodes: mpirun runs in the cluster's network namespace (tests/test_cluster.py checks the prefix).
    launch = plan["launch"][3:] if plan["launch"][0].endswith("nsenter") else plan["launch"]
    assert launch[0] == "mpirun" and "c1-node-0:1" not in plan["launch"]
    assert plan["launch"][plan["launch"].index("-H") + 1] == "gpucluster-node-0:1,gpucluster-node-1:1"
    assert plan["env"]["AZUREML_ARM_PROJECT_NAME"] == "pytorch-horovod"
    assert json.loads(amlemu("job", "list", "-o", "json")) == []


@pytest.mark.slow
def test_jobs_are_shared_between_processes(amlemu, tmp_path: Path) -> None:
    """A job created by one `amlemu` process is listed, shown and filtered by the next ones."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "hi.py").write_text("print('hi there', flush=True)\n")
    (tmp_path / "job.yml").write_text("code: code\ncommand: python hi.py\ncompute: c1\nexperiment_name: greet\n")
    amlemu("compute", "create", "--name", "c1", "--max-instances", "1", "--idle-time-before-scale-down", "0",
           "--backend", "process")
    home = str(tmp_path / "home")
    exe = str(Path(sys.executable).with_name("amlemu"))
    done = subprocess.run([exe, "--home", home, "job", "create", "-f", str(tmp_path / "job.yml"), "--stream"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hi there" in done.stdout and "Status: Completed" in done.stdout
    listed = json.loads(subprocess.run([exe, "--home", home, "job", "list", "--experiment", "greet", "-o", "json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert [j["status"] for j in listed] == ["Completed"]
    assert json.loads(amlemu("job", "list", "--experiment", "other", "-o", "json")) == []
    shown = json.loads(amlemu("job", "show", listed[0]["name"], "-o", "json"))
    assert [h["status"] for h in shown["amlemu"]["history"]][-1] == "Completed"
    downloaded = Path(amlemu("job", "download", listed[0]["name"], "--download-path", str(tmp_path / "dl"))
                      .split("downloaded to ")[1].strip())
    assert "hi there" in (downloaded / "user_logs" / "std_log.txt").read_text()  # one process: Azure ML's name


def test_fault_commands_speak_plainly(amlemu) -> None:
    amlemu("compute", "create", "--name", "ded", "--size", "STANDARD_D2_V2", "--backend", "process")
    amlemu("compute", "create", "--name", "low", "--size", "STANDARD_D2_V2", "--tier", "low_priority",
           "--backend", "process")
    assert "compute ded is dedicated: only low-priority nodes are preempted" in amlemu(
        "compute", "preempt", "ded", code=1)
    assert amlemu("compute", "preempt", "low").strip() == "preempted nothing (no node is up)"
    assert "low: 2 preemption(s) per node-hour, seed 7, at most 1 restart(s) per run" in amlemu(
        "compute", "preemption-policy", "low", "--rate-per-node-hour", "2", "--seed", "7", "--max-preemptions", "1")
    out = amlemu("fault", "kill-node", "low", "3", code=1)
    assert out.strip() == "amlemu: error: node '3 of compute low' not found; nodes up now: none"
    assert "--cpus: must be positive, got 0.0" in amlemu("fault", "slow", "low", "0", "--cpus", "0", code=1)
