"""MLflow's mount (emulator/service/mlflowmount.py): its state lives in one MlflowServer per mount,
with reset(); it writes nothing to the process's environment, and one process serving several homes
in turn (the tests' in-process services) gives each request its own home's store."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# In a fresh process, uvicorn imported first as `amlemu serve` does: MLflow then turns its security
# middleware on (decided at its import), which refuses foreign Host names and Origins.
SCRIPT = r"""
import json, os, sys
from pathlib import Path
import uvicorn  # noqa: F401
from amlemu.runs.homestore import store_path
from amlemu.service.mlflowmount import MlflowServer, _call_wsgi

before = dict(os.environ)
a, b = MlflowServer(Path(sys.argv[1])), MlflowServer(Path(sys.argv[2]))
# A link's host name and a foreign Origin, as a job's or a browser's request may carry.
HEADERS = {"content-type": "application/json", "host": "amlemu-link.invalid:8443", "origin": "https://elsewhere.invalid"}

def call(server, route, body):
    status, _, data = _call_wsgi(server.app(), "POST", "/api/2.0/mlflow/" + route, "", HEADERS, json.dumps(body).encode())
    assert status == 200, (route, status, data[:300])
    return json.loads(data)

def names(server):
    return sorted(e["name"] for e in call(server, "experiments/search", {"max_results": 100}).get("experiments", []))

call(a, "experiments/create", {"name": "only-in-a"})
call(b, "experiments/create", {"name": "only-in-b"})
out = {"a": names(a), "b": names(b), "a again": names(a)}
a.reset()  # its store removed and made again, as a cleaned home's: the next request serves the new one
store_path(Path(sys.argv[1])).unlink()
out["a after reset"] = names(a)
out["b after a's reset"] = names(b)
out["changed"] = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps(out))
"""


def test_the_mount_serves_each_homes_store_in_turn_and_writes_no_environment(tmp_path: Path) -> None:
    homes = [tmp_path / "home-a", tmp_path / "home-b"]
    for home in homes:
        home.mkdir()
    done = subprocess.run([sys.executable, "-c", SCRIPT, *map(str, homes)], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["a"] == got["a again"] == ["Default", "only-in-a"]
    assert got["b"] == got["b after a's reset"] == ["Default", "only-in-b"]
    assert got["a after reset"] == ["Default"]
    assert got["changed"] == []  # no MLFLOW_TRACKING_URI, no _MLFLOW_SERVER_*: the service's children inherit none


def test_mlflows_server_job_routes_are_refused_and_tracking_routes_are_not() -> None:
    from amlemu.service.mlflowmount import server_job_route  # noqa: PLC0415

    for path in ("/ajax-api/3.0/mlflow/genai/evaluate/invoke", "/ajax-api/3.0/mlflow/scorer/invoke",
                 "/api/3.0/mlflow/prompt-optimization/jobs", "/ajax-api/3.0/mlflow/jobs/cancel/j1",
                 "/ajax-api/3.0/mlflow/demo/generate", "/ajax-api/3.0/mlflow/issues/invoke"):
        assert server_job_route(path), path
    for path in ("/api/2.0/mlflow/runs/log-batch", "/api/2.0/mlflow/experiments/search",
                 "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval", "/api/2.0/mlflow/registered-models/create"):
        assert not server_job_route(path), path


def test_the_seed_template_is_named_by_the_installed_mlflows_version() -> None:
    """Read from the package's dist-info folder's name (fast): the same as importlib.metadata says."""
    from importlib.metadata import version

    from amlemu.runs.homestore import mlflow_version, template_path

    assert mlflow_version() == version("mlflow")
    assert template_path().name == f"seed-{version('mlflow')}.db"


def test_mlflows_version_is_read_from_mlflow_skinny_where_that_is_what_is_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Slim images (and the GPU check's offline bundle) have mlflow-skinny, MLflow's tracking client
    without its UI: its dist-info names the version."""
    import importlib.util
    from importlib.machinery import ModuleSpec

    from amlemu.runs import homestore

    (tmp_path / "mlflow").mkdir()
    (tmp_path / "mlflow" / "__init__.py").write_text("")
    (tmp_path / "mlflow_skinny-9.8.7.dist-info").mkdir()
    (tmp_path / "mlflow_tracing-9.8.7.dist-info").mkdir()
    spec = ModuleSpec("mlflow", None, origin=str(tmp_path / "mlflow" / "__init__.py"))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert homestore.mlflow_version() == "9.8.7"
    (tmp_path / "mlflow-9.8.6.dist-info").mkdir()
    assert homestore.mlflow_version() == "9.8.6"  # the full distribution first, as it is the one that names the store
