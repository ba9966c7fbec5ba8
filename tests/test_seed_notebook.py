"""The seed article's notebook (examples/seed_notebook.ipynb: SDK v1, azureml-core), executed
headless by nbclient as a user runs it: its cells unchanged, only its parameters cell (the source
folder, the data's datastore path) given after it as papermill does, in a kernel that has nothing
but the variables `amlemu env` prints and the config.json `amlemu workspace config` wrote; against
`amlemu serve` and docker nodes. Every cell runs, the PyTorch estimator's run (2 nodes x 1 process,
MPI, MNIST mounted from workspaceblobstore) completes, the test accuracy its v1 script logged with
`run.log` is in `run.get_metrics()`, and `RunDetails(run).show()` built its widget from the service
(the run's status, metrics and driver log). Docker is required: without an engine it fails."""
from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest
from conftest import FULL, REPO, TRAINING
from nbclient import NotebookClient
from test_service_sdk1 import BASE_ENV, Service, service  # noqa: F401 - the fixture: `amlemu serve` on docker nodes

NOTEBOOK = REPO / "examples" / "seed_notebook.ipynb"

# Appended after the notebook's cells (the user's view of the widget): the RunDetails widget that
# show() displayed, once its refresher read the finished run from the service.
WIDGET = """
import json, time
from ipywidgets import Widget
from azureml.widgets._userrun._widget import _UserRunWidget

def wait(done):
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not done():
        time.sleep(0.2)

found = [w for w in list(Widget.widgets.values()) if isinstance(w, _UserRunWidget)]
w = found[0] if found else None
# Its refresher fills status, metrics and the log pane in turn: the pane holds "Your job is
# submitted..." until the log itself arrives.
wait(lambda: w and w.run_properties.get("status") == "Completed" and w.run_metrics
     and "Run is completed." in (w.run_logs or ""))
default_log = w and w.run_logs
w.selected_run_log = "azureml-logs/70_driver_log_0.txt"  # the user picks rank 0's log in the widget
wait(lambda: "final test accuracy" in w.run_logs)
print(json.dumps({"widgets": len(found), "run_id": w.run_id, "status": w.run_properties.get("status"),
                  "log_files": sorted(w.run_properties.get("log_files", {})), "default_log": default_log,
                  "metrics": w.run_metrics, "logs": w.run_logs, "error": w.error}, default=str))
"""


def _parameters(nb: nbformat.NotebookNode, **values: str) -> None:
    """papermill's injection: a cell after the one tagged `parameters`, setting the given values."""
    at = next(i for i, cell in enumerate(nb.cells) if "parameters" in cell.metadata.get("tags", []))
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    nb.cells.insert(at + 1, nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]}))


def _text(cell: nbformat.NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", "") if out.output_type == "stream" else out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


@TRAINING
@pytest.mark.parametrize("full", [False, pytest.param(True, marks=[FULL, pytest.mark.timeout(1800)])],
                         ids=["subset", "full"])
def test_the_seed_notebook_runs_unchanged_and_its_v1_metrics_reach_get_metrics(
        service: Service, full: bool, request: pytest.FixtureRequest) -> None:
    # `make test`: 2,000 images must show learning; `make test-full`: the full MNIST's 95%.
    data, bar = (request.getfixturevalue("mnist_root"), 0.95) if full else \
        (request.getfixturevalue("mnist_subset"), 0.6)
    service.amlemu("data", "upload", str(data), "azureml://datastores/workspaceblobstore/paths/mnist", "-o", "none")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    _parameters(nb, project_folder=str(REPO / "trainer"), data_path="mnist")
    nb.cells.append(nbformat.v4.new_code_cell(WIDGET))
    env = {k: os.environ[k] for k in BASE_ENV if k in os.environ} | {"HOME": str(service.user_home)} | service.env

    NotebookClient(nb, kernel_name="python3", timeout=900, resources={"metadata": {"path": str(service.project)}}) \
        .execute(env=env)

    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert all(not any(o.output_type == "error" for o in cell.outputs) for cell in code)
    out = "\n".join(_text(cell) for cell in code)
    assert "Creating a new compute target..." in out and "'vmPriority': 'LowPriority'" in out
    assert "Streaming azureml-logs/70_driver_log_0.txt" in out and "Execution Summary" in out
    # run.get_metrics(): what rank 0's run.log sent, as the SDK reads it back.
    metrics = eval(_text(code[-2]), {})  # noqa: S307 - the repr of a dict of floats, from our own kernel
    accuracy = metrics["test_accuracy"]
    assert isinstance(accuracy, list) and len(accuracy) == 3 and accuracy[-1] >= bar, metrics
    # The widget RunDetails(run).show() displayed, filled from the service: the status, the metric, the log.
    widget = json.loads(_text(code[-1]).strip().splitlines()[-1])
    assert widget["widgets"] == 1 and widget["error"] == "", widget
    assert widget["status"] == "Completed"
    shown = {m["name"]: m for m in widget["metrics"]}
    assert shown["test_accuracy"]["run_id"] == widget["run_id"]
    assert shown["test_accuracy"]["series"] == [{"data": accuracy}]
    # Its log pane: v1's files, each fetched from the service's signed URL (by default the newest
    # group's first, mpirun's own log: empty for a run that went well).
    assert {"azureml-logs/70_driver_log_0.txt", "azureml-logs/70_mpi_log.txt"} <= set(widget["log_files"])
    # (mpirun may warn there first: "plm:rsh: Warning: setpgid(...) failed", a benign race of its own)
    assert widget["default_log"].strip().endswith("Run is completed.")
    assert "final test accuracy" in widget["logs"] and widget["logs"].endswith("Run is completed.")
    # The emulator ran it as any job: 2 ranks' driver logs in v1's layout.
    run_dir = service.home / "runs" / widget["run_id"]
    assert sorted(p.name for p in (run_dir / "azureml-logs").glob("70_driver_log_*.txt")) == \
        ["70_driver_log_0.txt", "70_driver_log_1.txt"]


def test_run_historys_metric_query_reads_back_as_the_sdk_merges_it() -> None:
    """RunDetails' metrics (v1widget.metrics_query): the values Run.log sent, read by azureml-core's
    own deserializer and merge; its refresher's `CreatedUtc gt` filter returns only newer values."""
    from datetime import datetime, timezone  # noqa: PLC0415

    from azureml._restclient.metrics_client import MetricsClient  # noqa: PLC0415
    from azureml._restclient.models.run_metric_dto import RunMetricDto  # noqa: PLC0415

    from amlemu.service.protocol.v1widget import run_metric_dtos  # noqa: PLC0415

    def sent(value: float, at: str) -> dict:  # a Run.log batch as the metric service keeps it
        return {"name": "acc", "columns": {"acc": "double"}, "properties": {"uxMetricType": "azureml.v1.scalar"},
                "value": [{"metricId": at, "createdUtc": at, "data": {"acc": value}}]}
    kept = [sent(0.5, "2026-12-01T10:00:00.000001Z"), sent(0.75, "2026-12-01T10:00:05.000001Z")]

    def merged(after: datetime | None) -> dict:
        dtos = [RunMetricDto.deserialize(d) for d in run_metric_dtos("r1", kept, after)]
        return MetricsClient.dto_to_metrics_dict(dtos)

    assert merged(None) == {"acc": [0.5, 0.75]}
    assert merged(datetime(2026, 12, 1, 10, 0, 1, tzinfo=timezone.utc)) == {"acc": 0.75}
