"""A job's interactive services (`services:`): jupyter_lab and tensor_board run beside the job on its
head node (every node with `nodes: all`), for the job's lifetime, each reachable from this machine
on 127.0.0.1:<port> through the run's relay, its endpoint in `amlemu job show` (and the service's
job resource) as Azure ML shows it; a node whose environment lacks the program skips the service
with a notice naming the package; ssh and vs_code are accepted with a notice."""
from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import BLOCK, STARTUP, release, wait_until

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.errors import ConfigError
from amlemu.jobs import resource
from amlemu.jobs.jobspec_io import job_from_record, job_to_record
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.runs.contract import NodeSlot, node_workdir
from amlemu.service.state import jobrest
from amlemu.runs.services import MISSING_EXIT, missing_notice, plan_services, service_command
from amlemu.specs import ServiceSpec

BASE = {"command": "python t.py", "code": "src", "compute": "azureml:c1"}
NODES = [NodeSlot(0, "c1-node-0", "10.0.0.2"), NodeSlot(1, "c1-node-1", "10.0.0.3")]


def _job(tmp_path: Path, services: dict[str, Any], **extra: Any):  # type: ignore[no-untyped-def]
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "t.py").write_text("print(1)\n")
    return job_from_dict({**BASE, "services": services, **extra}, base_dir=tmp_path)


def test_each_service_is_planned_on_its_nodes_with_its_argv(tmp_path: Path) -> None:
    job = _job(tmp_path, {"nb": {"type": "jupyter_lab"}, "tb": {"type": "tensor_board", "log_dir": "outputs/tb",
                                                                "nodes": "all"}},
               resources={"instance_count": 2}, distribution={"type": "pytorch"})
    plans = plan_services(job, "r1", NODES, agent="/venv/bin/amlemu-agent")
    assert [(p.name, p.node, p.port) for p in plans] == [
        ("nb", "c1-node-0", 8888), ("tb", "c1-node-0", 6006), ("tb", "c1-node-1", 6007)]  # head node; all nodes
    wd = node_workdir("r1")
    assert plans[0].argv == ("jupyter", "lab", "--no-browser", "--allow-root", "--ip=10.0.0.2", "--port=8888",
                             "--ServerApp.port_retries=0", f"--ServerApp.root_dir={wd}")
    assert plans[2].argv == ("tensorboard", f"--logdir={wd}/outputs/tb", "--host=10.0.0.3", "--port=6007")
    assert plans[2].launch[:2] == ("/venv/bin/amlemu-agent", "c1-node-1")
    # The supervisor's ports (free ones where nodes share a network) replace the defaults.
    chosen = plan_services(job, "r1", NODES, agent="a", ports={"tb@c1-node-1": 41000})
    assert chosen[2].port == 41000 and "--port=41000" in chosen[2].argv
    assert job_from_record(json.loads(json.dumps(job_to_record(job)))).services == job.services


def test_a_node_without_the_program_skips_the_service_naming_the_package(tmp_path: Path) -> None:
    """The node's shell exits MISSING_EXIT before reading a token or starting anything."""
    job = _job(tmp_path, {"nb": {"type": "jupyter_lab"}})
    plan = plan_services(job, "r1", NODES, agent="a")[0]
    command = service_command(plan.program, plan.argv, str(tmp_path), plan.token)
    done = subprocess.run(["/bin/sh", "-c", command], env={"PATH": str(tmp_path / "empty-bin")}, input="secret\n",
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == MISSING_EXIT
    assert missing_notice(plan) == ("services.nb (jupyter_lab) is skipped on c1-node-0: the job's environment has "
                                    "no `jupyter`; add jupyterlab to the environment (its conda file or image) to open it")
    assert "secret" not in command and "token" not in " ".join(plan.argv).lower()  # from stdin only


def test_ssh_and_vs_code_are_accepted_with_a_notice_and_nodes_must_be_all(tmp_path: Path) -> None:
    job = _job(tmp_path, {"s": {"type": "ssh", "ssh_public_keys": "ssh-ed25519 AAAA me"}, "v": {"type": "vs_code"},
                          "nb": {"type": "jupyter_lab"}})
    assert [n.split(":")[0] for n in job.notices] == ["services.s (ssh) is not emulated", "services.v (vs_code) is not emulated"]
    assert "jupyter_lab" in job.notices[1]  # what to use instead
    assert plan_services(job, "r1", NODES, agent="a")[0].name == "nb"
    with pytest.raises(ConfigError, match="services.nb.nodes"):
        ServiceSpec("nb", "jupyter_lab", nodes="2")


def test_the_job_resource_shows_each_service_as_azure_ml_does(tmp_path: Path) -> None:
    declared = [{"name": "nb", "type": "jupyter_lab"}, {"name": "tb", "type": "tensor_board", "log_dir": "tb",
                                                        "nodes": "all"}, {"name": "s", "type": "ssh"}]
    (tmp_path / resource.SERVICES_RECORD).write_text(json.dumps({
        "nb": {"type": "jupyter_lab", "nodes": {"n0": {"status": "Running", "endpoint": "http://127.0.0.1:5/lab?token=t",
                                                       "error": None}}},
        "tb": {"type": "tensor_board", "nodes": {"n0": {"status": "Failed", "endpoint": "http://127.0.0.1:6/",
                                                        "error": "no tensorboard"},
                                                 "n1": {"status": "Running", "endpoint": "http://127.0.0.1:7/",
                                                        "error": None}}}}))
    rest = resource.job_services(tmp_path, declared, run_ended=False)
    assert rest["nb"] == {"jobServiceType": "JupyterLab", "status": "Running", "endpoint": "http://127.0.0.1:5/lab?token=t"}
    assert rest["tb"]["properties"] == {"logDir": "tb", "endpoint.n0": "http://127.0.0.1:6/",
                                        "endpoint.n1": "http://127.0.0.1:7/"}
    assert rest["s"] == {"jobServiceType": "SSH"}
    shown = resource.az_job({"id": "x", "properties": {"services": rest}})["services"]
    assert shown["nb"] == {"endpoint": "http://127.0.0.1:5/lab?token=t", "type": "jupyter_lab", "status": "Running"}
    assert shown["tb"]["nodes"] == "all" and shown["tb"]["log_dir"] == "tb" and shown["tb"]["error_message"] == "no tensorboard"
    ended = resource.job_services(tmp_path, declared, run_ended=True)
    assert ended["nb"]["status"] == "Stopped" and "token" not in ended["nb"]["endpoint"]


def test_an_sdk_job_s_services_are_the_yaml_s(tmp_path: Path) -> None:
    """azure-ai-ml's JobService entities as the SDK PUTs them through `amlemu serve`: the body of
    command(..., services={"nb": JupyterLabJobService(), "tb": TensorBoardJobService(log_dir="tb",
    nodes="all"), "v": VsCodeJobService()}) (azure-ai-ml itself takes seconds to import)."""
    services = {"nb": {"jobServiceType": "JupyterLab"}, "v": {"jobServiceType": "VSCode"},
                "tb": {"jobServiceType": "TensorBoard", "nodes": {"nodesValueType": "All"}, "properties": {"logDir": "tb"}}}
    body = {"properties": {"jobType": "Command", "command": "echo hi", "services": services}}
    data = jobrest.to_yaml("j1", body, lambda name, version: tmp_path, lambda env_id: "python:3.11")
    assert job_from_dict(data, base_dir=tmp_path).services == (
        ServiceSpec("nb", "jupyter_lab"), ServiceSpec("v", "vs_code"),
        ServiceSpec("tb", "tensor_board", nodes="all", log_dir="tb"))


def _show(emu: Emulator, name: str) -> dict[str, Any]:
    result = CliRunner().invoke(cli, ["--home", str(emu.home.root), "job", "show", "-n", name, "-o", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _opened(url: str) -> str:
    """Where a browser ends up at `url` (redirects followed): its path."""
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 - the relay on 127.0.0.1
        assert answer.status == 200
        return urllib.parse.urlparse(answer.url).path


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_jupyter_lab_and_tensorboard_are_reachable_while_the_job_runs_and_closed_after(emu: Emulator, cluster, make_job) -> None:  # type: ignore[no-untyped-def]
    cluster(max_nodes=1)
    job = make_job(BLOCK, distribution="none", extra="""
        services:
          nb: {type: jupyter_lab}
          tb: {type: tensor_board, log_dir: outputs/tb}
        """)
    planned = emu.plan_job(job)["services"]  # the dry run: each service's argv on its node
    assert [(s["name"], s["node"], s["argv"][0]) for s in planned] == [("nb", "c1-node-0", "jupyter"),
                                                                       ("tb", "c1-node-0", "tensorboard")]
    run = emu.submit(job)

    def running() -> dict[str, Any] | None:
        services = _show(emu, run.id)["services"]
        return services if all(services[s].get("status") == "Running" for s in ("nb", "tb")) else None
    services = wait_until(running, STARTUP, "both services answer on their nodes")
    nb, tb = services["nb"]["endpoint"], services["tb"]["endpoint"]
    assert nb.startswith("http://127.0.0.1:") and "/lab?token=" in nb and services["nb"]["type"] == "jupyter_lab"
    assert _opened(nb) == "/lab"  # the token opens it
    assert _opened(nb.split("?")[0]) == "/login"  # without it: Jupyter's login page
    assert _opened(tb) == "/"
    text = CliRunner().invoke(cli, ["--home", str(emu.home.root), "job", "show", "-n", run.id]).stdout
    assert f"service nb (jupyter_lab): Running {nb}" in text and f"service tb (tensor_board): Running {tb}" in text
    token = nb.split("token=")[1]
    logs = "".join(p.read_text() for p in emu.home.run_dir(run.id).rglob("*.txt"))
    assert token not in logs  # never in a log: Jupyter shows a token it was given as "..."
    release(emu, run)
    assert run.wait(timeout=STARTUP).value == "Completed"
    after = _show(emu, run.id)["services"]["nb"]
    assert after["status"] == "Stopped" and "token" not in after["endpoint"]
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(nb, timeout=10)  # noqa: S310 - the relay's port is closed

    # A node whose environment has no tensorboard (its PATH holds only the system's): skipped, named.
    bare = make_job(BLOCK, distribution="none", extra="""
        environment_variables: {PATH: /usr/bin:/bin}
        services:
          tb: {type: tensor_board}
        """)
    bare.write_text(bare.read_text().replace("command: python ", "command: python3 "))
    run = emu.submit(bare)
    skipped = wait_until(lambda: _show(emu, run.id)["services"]["tb"].get("error_message"), STARTUP, "tb is skipped")
    assert "has no `tensorboard`; add tensorboard to the environment" in skipped
    release(emu, run)
    assert run.wait(timeout=STARTUP).value == "Completed"  # the job ran on without it


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_on_docker_nodes_a_service_on_every_node_is_relayed_to_each(emu: Emulator, cluster, make_job) -> None:  # type: ignore[no-untyped-def]
    """Docker nodes: the relay reaches each node at its address on the cluster network."""
    cluster(max_nodes=2)
    run = emu.submit(make_job(BLOCK, nodes=2, distribution="pytorch", extra="""
        services:
          tb: {type: tensor_board, nodes: all}
        """))

    def running() -> dict[str, Any] | None:
        tb = _show(emu, run.id)["services"]["tb"]
        return tb if tb.get("status") == "Running" and len(tb.get("properties", {})) == 2 else None
    tb = wait_until(running, STARTUP, "tensorboard answers on both nodes")
    endpoints = sorted(tb["properties"].values())
    assert tb["nodes"] == "all" and len(set(endpoints)) == 2
    assert all(e.startswith("http://127.0.0.1:") and _opened(e) == "/" for e in endpoints)
    release(emu, run)
    assert run.wait(timeout=STARTUP).value == "Completed"
    for endpoint in endpoints:
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(endpoint, timeout=10)  # noqa: S310 - closed with the job
