"""The background service (`amlemu env` starts `amlemu serve`) detaches as a daemon does, and keeps
serving MLflow after the folder it was started from is removed (a CI step's temporary folder);
`workspace show` reports its health; a registry.json cut short does not stop it from starting."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import requests

from amlemu import servicefile


def amlemu(home: Path, *args: str, cwd: Path | None = None) -> str:
    done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), *args], capture_output=True, text=True,
                          timeout=180, cwd=cwd, env={**os.environ, "AMLEMU_BACKEND": "process"})
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_background_service_outlives_the_folder_it_was_started_from(home: Path, tmp_path: Path) -> None:
    registry = home / "service" / "registry.json"
    registry.parent.mkdir(parents=True)
    registry.write_text('{"codes": {"src\\n1": {"id": ')  # a write cut short (before writes were staged)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    variables = json.loads(amlemu(home, "env", "--format", "json", "--port", "0", cwd=scratch))
    state = servicefile.read_state(home)
    assert state is not None
    daemon = psutil.Process(state.pid)
    assert daemon.cwd() == "/"
    assert os.getsid(state.pid) == state.pid != os.getsid(0)  # a session of its own
    assert os.readlink(f"/proc/{state.pid}/fd/0") == "/dev/null"
    assert os.readlink(f"/proc/{state.pid}/fd/1") == str(home / "service" / "service.log")
    umask = next(line for line in Path(f"/proc/{state.pid}/status").read_text().splitlines() if line.startswith("Umask"))
    assert umask.split()[1] == "0022"
    shutil.rmtree(scratch)

    ca = variables["REQUESTS_CA_BUNDLE"]
    token = requests.get(variables["IDENTITY_ENDPOINT"], params={"resource": state.url}, verify=ca, timeout=30,
                         headers={"X-IDENTITY-HEADER": variables["IDENTITY_HEADER"]}).json()["access_token"]
    api = f"{state.url}/mlflow/api/2.0/mlflow"

    def call(route: str, body: dict[str, object]) -> dict[str, object]:
        answer = requests.post(f"{api}/{route}", json=body, headers={"Authorization": f"Bearer {token}"}, verify=ca,
                               timeout=60)
        assert answer.status_code == 200, (route, answer.text)
        return dict(answer.json())
    experiment = call("experiments/create", {"name": "after-the-folder-went"})["experiment_id"]
    run = call("runs/create", {"experiment_id": experiment, "start_time": 0})["run"]
    run_id = run["info"]["run_id"]  # type: ignore[index]
    call("runs/log-metric", {"run_id": run_id, "key": "loss", "value": 0.5, "timestamp": 0, "step": 1})
    history = requests.get(f"{api}/metrics/get-history", params={"run_id": run_id, "metric_key": "loss"},
                           headers={"Authorization": f"Bearer {token}"}, verify=ca, timeout=60).json()
    assert [m["value"] for m in history["metrics"]] == [0.5]

    shown = json.loads(amlemu(home, "workspace", "show", "-o", "json", cwd=tmp_path))
    assert shown["service_health"] == "ok", shown
    log = (home / "service" / "service.log").read_text()
    assert "registry.json could not be read" in log and "Traceback" not in log
    assert [p.name.startswith("registry.json.corrupt-") for p in registry.parent.iterdir()].count(True) == 1


def test_a_ca_cut_short_stops_serve_with_one_line_naming_it(home: Path) -> None:
    folder = home / "service"
    folder.mkdir(parents=True)
    (folder / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\nMIIB")
    (folder / "ca-key.pem").write_text("-----BEGIN PRIVATE KEY-----\n")
    done = subprocess.run([sys.executable, "-m", "amlemu", "--home", str(home), "serve", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "ca.pem" in lines[0] and "move ca.pem and ca-key.pem away" in lines[0], done.stderr
    assert "this is a bug" not in done.stderr and "Traceback" not in done.stderr


def test_the_daemons_paths_do_not_depend_on_where_it_was_started(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from amlemu.service.server import _daemon_env  # noqa: PLC0415 - the one function under test

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMLEMU_CACHE", "cache")
    monkeypatch.setenv("PYTHONPATH", f"src{os.pathsep}{os.pathsep}/abs")
    monkeypatch.setenv("AMLEMU_DEBUG", "1")
    env = _daemon_env()
    assert env["AMLEMU_CACHE"] == str(tmp_path / "cache")
    assert env["PYTHONPATH"] == f"{tmp_path / 'src'}{os.pathsep}{os.pathsep}/abs"
    assert "AMLEMU_DEBUG" not in env and "PWD" not in env
