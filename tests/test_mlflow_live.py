"""MLflow, live (`amlemu serve`): an online job's MLFLOW_TRACKING_URI is the service's MLflow tracking
server over the home's store, so MlflowClient/search_runs with the user's token see a running job's
first points; after the end `amlemu job show` and metrics.png have every point. A run's token writes
to its own MLflow run only. Jobs are tiny (no torch); the job waits on a file the test writes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests
from conftest import FULL, release, served, service_cli, wait_until

from amlemu import servicefile
from amlemu.api import Emulator
from amlemu.runs.homestore import store_path
from amlemu.service.protocol.auth import Auth
from amlemu.specs import ClusterSpec, RunStatus
from amlemu.studio.uistore import build_ui_store, ui_store_path

JOB = """
import os, time
import mlflow
release = os.path.join(os.environ["AZUREML_CR_EXECUTION_WORKING_DIR_PATH"], "..", "..", "release")
with mlflow.start_run():  # attaches to MLFLOW_RUN_ID, the job's run
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    while not os.path.exists(release):
        time.sleep(0.05)
    for step in range(3, 6):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
print("logged to", os.environ["MLFLOW_TRACKING_URI"].split("://")[0], flush=True)
"""


def _user_token(home: Path, url: str, ca: str) -> str:
    """The user's workspace token, as azure-identity gets it with `amlemu env`'s IDENTITY_HEADER."""
    secret = Auth.load_or_create(home / "service" / "secrets.json").identity_header
    answer = requests.get(f"{url}/msi/token", params={"resource": url + "/", "api-version": "2019-08-01"},
                          headers={"X-IDENTITY-HEADER": secret}, verify=ca, timeout=30)
    return answer.json()["access_token"]


# Docker nodes' run link is tried in make test by test_job_reach and the v1 cells on docker nodes
# (test_service_sdk1); MLflow's own path through it is the same on both backends (suite time: full).
@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=FULL)], indirect=True)
def test_an_online_jobs_mlflow_metrics_are_seen_while_it_runs(emu: Emulator, backend: str, make_job, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = emu.home.root
    with served(home, tmp_path, backend, config=False) as env:
        url, ca = servicefile.read_state(home).url, env["REQUESTS_CA_BUNDLE"]
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1, idle_seconds_before_scaledown=0))
        run = emu.submit(make_job(JOB, name="live"))
        monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", _user_token(home, url, ca))
        monkeypatch.setenv("MLFLOW_TRACKING_SERVER_CERT_PATH", ca)
        from mlflow.tracking import MlflowClient  # noqa: PLC0415

        client = MlflowClient(tracking_uri=f"{url}/mlflow")

        def first_points() -> list[float]:
            if run.status.is_terminal:
                raise AssertionError(f"the job ended before it was released: {run.status}")
            return [m.step for m in client.get_metric_history(run.id, "loss")] if run.status is RunStatus.RUNNING else []
        wait_until(lambda: len(first_points()) == 3, 180, "the running job's first three points are seen")
        found = client.search_runs([client.get_experiment_by_name("live").experiment_id])
        assert [(r.info.run_id, r.info.status) for r in found] == [(run.id, "RUNNING")]
        # The record reads them too, as the studio page's charts and `amlemu job show` do, mid-run.
        assert [s for s, _ in run.metric_history()["loss"]] == [0, 1, 2]
        _a_run_token_writes_to_its_own_run_only(home, url, ca, run.id)
        release(emu, run)
        assert run.wait(timeout=180) is RunStatus.COMPLETED, run.logs()
        assert "logged to https" in (run.dir / "user_logs" / "std_log.txt").read_text()
        assert client.get_run(run.id).info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(run.id, "loss")) == list(range(6))
        assert (run.dir / "metrics.png").stat().st_size > 0
        assert not (run.dir / "mlflow.db").exists()  # nothing went to the nodes' stores
        # The service stopped: the record still reads every point from the home's store.
        service_cli(home, tmp_path, "serve", "--stop", backend=backend)
        shown = json.loads(service_cli(home, tmp_path, "job", "show", "-n", run.id, "-o", "json",
                                       backend=backend).stdout)
        assert shown["amlemu"]["metrics"]["loss"] == pytest.approx(1 / 6)
        assert run.metric_history()["loss"] == [(s, pytest.approx(1.0 / (s + 1))) for s in range(6)]
        # `amlemu ui --mlflow` serves the same store: the online run is there already, never copied.
        assert build_ui_store(emu, ui_store_path(emu)) == 0 and ui_store_path(emu) == store_path(home)


def _a_run_token_writes_to_its_own_run_only(home: Path, url: str, ca: str, run_id: str) -> None:
    token, _ = Auth.load_or_create(home / "service" / "secrets.json").issue_for_run(run_id, 600)
    api = f"{url}/mlflow/api/2.0/mlflow"

    def call(method: str, route: str, **kwargs) -> requests.Response:  # type: ignore[no-untyped-def]
        return requests.request(method, f"{api}/{route}", headers={"Authorization": f"Bearer {token}"}, verify=ca,
                                timeout=30, **kwargs)
    point = {"key": "x", "value": 1.0, "timestamp": 0, "step": 0}
    assert call("POST", "runs/log-metric", json={"run_id": run_id, **point}).status_code == 200
    assert call("GET", "runs/get", params={"run_id": run_id}).status_code == 200
    refused = [("runs/log-metric", {"run_id": "someone-else", **point}),
               ("runs/log-batch", {"run_id": run_id, "run_uuid": "someone-else", "metrics": [point]}),
               ("runs/log-metric", point), ("runs/create", {"experiment_id": "0"}),
               ("runs/delete", {"run_id": run_id}), ("experiments/create", {"name": "mine"}),
               ("registered-models/create", {"name": "m"})]
    for route, body in refused:
        answer = call("POST", route, json=body)
        assert answer.status_code == 403, (route, answer.text)
        assert answer.json()["error"]["code"] == "AuthorizationFailed"
    assert requests.get(f"{api}/runs/get", params={"run_id": run_id}, verify=ca, timeout=30).status_code == 401
    assert token not in (home / "service" / "service.log").read_text()


def test_a_run_tokens_mlflow_calls_read_the_workspace_and_write_its_own_run_only() -> None:
    from amlemu.service.mlflowmount import run_token_refusal  # noqa: PLC0415

    api = "/api/2.0/mlflow"
    allowed = [("GET", f"{api}/runs/get", "run_id=other", b""), ("GET", f"{api}/experiments/get-by-name", "name=e", b""),
               ("POST", f"{api}/runs/search", "", b"{}"), ("GET", "/ajax-api/2.0/mlflow/metrics/get-history", "", b""),
               ("POST", f"{api}/runs/log-batch", "", b'{"run_id": "mine", "metrics": []}'),
               ("POST", f"{api}/runs/update", "", b'{"run_id": "mine", "run_uuid": "mine", "status": "RUNNING"}')]
    for method, path, query, body in allowed:
        assert run_token_refusal(method, path, query, body, "mine") is None, path
    refused = [("POST", f"{api}/runs/update", "", b'{"run_id": "other"}'), ("POST", f"{api}/runs/set-tag", "", b"x"),
               ("POST", f"{api}/runs/log-metric", "run_id=other", b'{"run_id": "mine"}'),
               ("POST", f"{api}/runs/delete", "", b'{"run_id": "mine"}'), ("POST", f"{api}/experiments/delete", "", b"{}"),
               ("GET", f"{api}/registered-models/get", "", b""), ("GET", "/get-artifact", "path=x&run_uuid=mine", b""),
               ("DELETE", f"{api}/runs/delete-tag", "", b'{"run_id": "mine"}')]
    for method, path, query, body in refused:
        assert run_token_refusal(method, path, query, body, "mine"), (method, path, query)
