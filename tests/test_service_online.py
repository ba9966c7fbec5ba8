"""The run inside a v1 job is online (`amlemu serve`): a job submitted with azureml-core's
ScriptRunConfig through the service, whose ranks call Run.get_context(allow_offline=False) and log
metrics, a row, tags and files, completes on both backends; what it sent is in run.get_metrics(),
get_tags() and get_file_names() of the submitting process and in `amlemu job show`, beside its MLflow
metric, and the run's logs are the v1 runtime's (azureml-logs/). The run's token opens its own run
only, expires with it, and is found nowhere in the home afterwards. Jobs are tiny (no torch)."""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from conftest import BLOCK, FULL, V1_CLUSTER_AND_MPI_JOB, release, served, service_cli, wait_until

from amlemu import servicekeys
from amlemu.api import Emulator
from amlemu.home import Home
from amlemu.service.protocol.auth import Auth
from amlemu.service.protocol.calls import Context
from amlemu.service.state.emulator import EmulatorState
from amlemu.service.server import run_in_thread
from amlemu.specs import ClusterSpec, RunStatus

BASE_ENV = ("PATH", "LANG", "PYTHONPATH")

JOB = '''
import os
from azureml.core import Run

run = Run.get_context(allow_offline=False)  # raises when the run is not online
rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
run.log("accuracy", 0.5 + rank / 10)
run.log_list("losses", [0.5, 0.25])
run.log_row("epochs", epoch=rank, loss=0.125)
run.tag(f"rank{rank}", "done")
if rank == 0:
    run.log_table("table", {"a": [1, 2], "b": [0.5, 0.25]})
    with open("dot.png", "wb") as out:  # a 1x1 PNG: log_image uploads it and logs a reference to it
        out.write(bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                                "1f15c4890000000d49444154789c63f8ffff3f0005fe02fe0def46b80000000049454e44ae426082"))
    run.log_image("dot", path="dot.png")
with open("note.txt", "w") as out:
    out.write(f"note of rank {rank}\\n")
run.upload_file(name=f"outputs/note_{rank}.txt", path_or_stream="note.txt")
print("online:", type(run).__name__, run.id, run.experiment.name, run.experiment.workspace.name, run.parent,
      flush=True)
if rank == 0:
    import mlflow  # MLflow calls of the same job land as before, in the run's MLflow store
    mlflow.log_metric("mlflow_metric", 3.0)
'''

SUBMIT = "import json, sys\n" + V1_CLUSTER_AND_MPI_JOB + '''
run = Experiment(ws, "online-v1").submit(mpi_job("online.py"))
run.wait_for_completion(show_output=True)
print("status:", run.get_status())
print("metrics:", json.dumps(run.get_metrics()))
print("tags:", json.dumps(run.get_tags()))
print("files:", json.dumps(run.get_file_names()))
'''
JWT_RE = re.compile(rb"eyJ[A-Za-z0-9_-]+\.eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")


def _line(out: str, key: str):  # type: ignore[no-untyped-def]
    found = re.search(rf"^{key}: (.*)$", out, re.M)
    assert found, out[-3000:]
    return json.loads(found[1])


def _run_tokens_in(root: Path) -> list[str]:
    """Files under `root` holding a run's token (a JWT whose claims name a run), read as bytes."""
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                continue
            for match in JWT_RE.finditer(path.read_bytes()):
                payload = match.group().split(b".")[1].decode()
                try:
                    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
                except ValueError:
                    continue
                if isinstance(claims, dict) and servicekeys.RUN_CLAIM in claims:
                    found.append(str(path))
    return found


# Docker nodes in test-full: their link to the service is checked in make test by test_mlflow_live's
# and test_job_reach's docker cases; the v1 protocol itself is the same on both (~60 s each on CI).
@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=FULL)], indirect=True)
def test_a_v1_jobs_ranks_log_to_the_online_run_on_both_backends(backend: str, tmp_path: Path, _homes: set[str]) -> None:
    home, project, user, src = (tmp_path / n for n in ("home", "project", "user", "src"))
    for folder in (home, project, user, src):
        folder.mkdir()
    _homes.add(Home.at(home).id)
    (src / "online.py").write_text(JOB)
    (tmp_path / "submit.py").write_text(SUBMIT)
    with served(home, project, backend) as env:
        done = subprocess.run([sys.executable, str(tmp_path / "submit.py"), str(src)], cwd=project, capture_output=True,
                              text=True, timeout=600, env={k: os.environ[k] for k in BASE_ENV if k in os.environ}
                              | {"HOME": str(user)} | env)
        out = done.stdout
        assert done.returncode == 0, (out + done.stderr)[-4000:]
        name = re.search(r"^RunId: (\S+)$", out, re.M)[1]
        assert "status: Completed" in out
        # wait_for_completion streamed the v1 runtime's driver log of rank 0; the job saw the online run.
        assert "Streaming azureml-logs/70_driver_log_0.txt" in out
        log = (home / "runs" / name / "azureml-logs" / "70_driver_log_0.txt").read_text()
        assert f"online: _SubmittedRun {name} online-v1 amlemu-ws None" in log
        # Both ranks' values, in the submitting process through the service.
        metrics = _line(out, "metrics")
        assert sorted(metrics["accuracy"]) == [0.5, 0.6]
        assert metrics["losses"] == [0.5, 0.25, 0.5, 0.25]
        assert sorted(metrics["epochs"]["epoch"]) == [0, 1] and metrics["epochs"]["loss"] == [0.125, 0.125]
        assert metrics["table"] == {"a": [1, 2], "b": [0.5, 0.25]}
        assert "dot" in metrics  # an image: its value is the reference to the file log_image uploaded
        assert {k: v for k, v in _line(out, "tags").items() if k.startswith("rank")} == {"rank0": "done",
                                                                                         "rank1": "done"}
        files = _line(out, "files")
        assert {"outputs/note_0.txt", "outputs/note_1.txt", "azureml-logs/70_driver_log_0.txt",
                "azureml-logs/70_driver_log_1.txt"} <= set(files)
        assert not any(f.startswith("user_logs/") for f in files)
        assert (home / "runs" / name / "outputs" / "note_1.txt").read_text() == "note of rank 1\n"
        # `amlemu job show` reads the same record: the v1 values and the MLflow metric of the same job.
        shown = json.loads(service_cli(home, project, "job", "show", "-n", name, "-o", "json", backend=backend).stdout)
        metrics = shown["amlemu"]["metrics"]
        assert shown["status"] == "Completed" and metrics["mlflow_metric"] == 3.0
        assert metrics["losses"] == 0.25 and metrics["epochs.loss"] == 0.125
        assert metrics["accuracy"] in (0.5, 0.6)
        # The run's token is in no file of the home (its service log, its record, the nodes' disks).
        lifecycle = (home / "runs" / name / "system_logs" / "lifecycle.txt").read_text()
        assert "online: the run reaches the service at https://amlemu-service.blob.internal:" in lifecycle
        assert _run_tokens_in(home) == []
        service_log = (home / "service" / "service.log").read_text()
        assert "Bearer" not in service_log and "sig=" not in service_log


WS = "/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/workspaces/{ws}"


def test_a_runs_token_opens_its_own_run_only_and_expires_with_it(tmp_path: Path, make_job, _homes: set[str]) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    _homes.add(emu.home.id)
    auth = Auth.fresh()
    lines: list[str] = []
    running = run_in_thread(Context(EmulatorState(emu, lines.append), auth, log=lines.append), tmp_path / "tls")
    ca = tmp_path / "tls" / "ca-bundle.pem"
    try:
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=2, idle_seconds_before_scaledown=0))
        other = emu.submit(make_job("print('done')", name="other"))
        assert other.wait(timeout=120) is RunStatus.COMPLETED
        mine = emu.submit(make_job(BLOCK, name="mine"))
        wait_until(lambda: mine.status is RunStatus.RUNNING, 120, "the blocking job runs")
        ws = emu.workspace()
        base = running.url + WS.format(sub=ws["subscription_id"], rg=ws["resource_group"], ws=ws["workspace_name"])
        token, _ = auth.issue_for_run(mine.id, 600)
        bearer = {"Authorization": f"Bearer {token}"}

        def call(method: str, url: str, **kwargs):  # type: ignore[no-untyped-def]
            return requests.request(method, url, headers=bearer, verify=ca, timeout=30, **kwargs)

        history = base.replace("/subscriptions", "/history/v1.0/subscriptions")
        metric = base.replace("/subscriptions", "/metric/v2.0/subscriptions")
        own = call("GET", f"{history}/experiments/mine/runs/{mine.id}")
        assert own.status_code == 200 and own.json()["runId"] == mine.id
        assert call("POST", f"{metric}/runs/{mine.id}/batch", json={"values": [
            {"name": "m", "columns": {"m": "double"}, "value": [{"data": {"m": 1.5}}]}]}).status_code == 200
        assert mine.metrics() == {"m": 1.5}
        refreshed = call("GET", f"{history}/experiments/mine/runs/{mine.id}/token").json()["token"]
        assert auth.claims(f"Bearer {refreshed}")[servicekeys.RUN_CLAIM] == mine.id
        # Another run, and the workspace's own routes: ARM's 403, naming the token's run.
        artifacts = base.replace("/subscriptions", "/artifact/v2.0/subscriptions") + "/artifacts"
        refused = [("GET", f"{history}/experiments/other/runs/{other.id}", {}),
                   ("GET", f"{history}/experiments/other/runs/{other.id}/details", {}),
                   ("POST", f"{metric}/runs/{other.id}/batch", {"json": {"values": []}}),
                   ("POST", f"{artifacts}/batch/metadata/ExperimentRun/dcid.{other.id}", {"json": {"paths": [{"path": "x"}]}}),
                   ("GET", base, {}), ("GET", f"{base}/computes", {}), ("PUT", f"{base}/computes/c2", {"json": {}}),
                   ("PUT", f"{base}/jobs/x", {"json": {}}), ("GET", f"{base}/jobs", {}),
                   ("POST", f"{base}/datastores/workspaceblobstore/listSecrets", {}),
                   ("POST", f"{history}/experiments:query", {"json": {}}),
                   ("POST", base.replace("/subscriptions", "/execution/v1.0/subscriptions")
                    + "/experiments/mine/startrun?runId=r2", {"data": b"x"})]
        for method, url, kwargs in refused:
            answer = call(method, url, **kwargs)
            assert answer.status_code == 403, (method, url, answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == "AuthorizationFailed"
        assert not (emu.home.run_dir(other.id) / "run-history").exists()
        # Its files: only under names within its own record, and an upload URL signed for it only.
        created = call("POST", f"{artifacts}/batch/metadata/ExperimentRun/dcid.{mine.id}",
                       json={"paths": [{"path": "outputs/ok.txt"}]})
        upload = created.json()["artifactContentInformation"]["outputs/ok.txt"]["contentUri"]
        for bad in ("../../escape.txt", "system_logs/lifecycle.txt", "/etc/passwd", "outputs/../../x"):
            answer = call("POST", f"{artifacts}/batch/metadata/ExperimentRun/dcid.{mine.id}",
                          json={"paths": [{"path": bad}]})
            assert answer.status_code == 400, bad
        elsewhere = upload.replace(f"/{mine.id}/", f"/{other.id}/")
        assert requests.put(elsewhere, data=b"x", verify=ca, timeout=30).status_code == 403
        assert requests.put(upload, data=b"kept", verify=ca, timeout=30).status_code == 201
        assert (emu.home.run_dir(mine.id) / "outputs" / "ok.txt").read_bytes() == b"kept"
        # A token another home signed opens nothing; a workspace token still opens every run.
        forged, _ = servicekeys.run_token(Auth.fresh().key, mine.id, 600)
        assert requests.get(f"{history}/experiments/mine/runs/{mine.id}", headers={"Authorization": f"Bearer {forged}"},
                            verify=ca, timeout=30).status_code == 401
        workspace_token, _ = auth.issue()
        assert requests.get(f"{history}/experiments/other/runs/{other.id}", verify=ca, timeout=30,
                            headers={"Authorization": f"Bearer {workspace_token}"}).status_code == 200
        # The run ends: its token with it.
        release(emu, mine)
        assert mine.wait(timeout=120) is RunStatus.COMPLETED
        expired = call("GET", f"{history}/experiments/mine/runs/{mine.id}")
        assert expired.status_code == 401 and expired.json()["error"]["code"] == "ExpiredAuthenticationToken"
        assert requests.put(upload, data=b"late", verify=ca, timeout=30).status_code == 403
    finally:
        running.stop()
        emu.cleanup()
    assert token not in "\n".join(lines) and refreshed not in "\n".join(lines)
