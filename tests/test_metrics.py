"""Metrics to look at: each run's metrics.png (also after a failure or a preemption), `amlemu job
show`'s metrics and plot, one MLflow store over every run (copied once, refreshed while active) and
MLflow's own UI (`amlemu ui`), stopped with everything it started on Ctrl-C."""
from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner
from conftest import STARTUP, JobFactory, assert_nothing_left, release, wait_until

from amlemu.api import Emulator, Run
from amlemu.cli import cli
from amlemu.runs.homestore import template_path
from amlemu.runs.metrics import PLOT_NAME, SEED_TAG, empty_store, merge_store, plot_metrics, plot_run, seed_store
from amlemu.studio.uistore import UI_RUN_TAG, UI_STATUS_TAG, build_ui_store
from amlemu.specs import ClusterSpec, RunStatus

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PROCESS = pytest.mark.parametrize("backend", ["process"], indirect=True)

# Two metrics over three steps, then the exit code given (a failed run has metrics too).
LOGS = """
import sys, mlflow
for step in range(3):
    mlflow.log_metrics({"loss": 1.0 / (step + 1), "accuracy": 0.5 + 0.2 * step}, step=step)
print("logged", flush=True)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""

# Step 0, then waits for the host to drop a file into the run's record before step 1.
STEPWISE = """
import os, time, mlflow
mlflow.log_metric("progress", 0.0, step=0)
print("step 0 logged", flush=True)
release = os.path.join(os.environ["AZUREML_CR_EXECUTION_WORKING_DIR_PATH"], "..", "..", "release")
while not os.path.exists(release):
    time.sleep(0.05)
mlflow.log_metric("progress", 1.0, step=1)
"""

# Each attempt logs its number as a step; the first blocks until it is preempted.
ATTEMPTS = """
import glob, os, time, mlflow
os.makedirs("outputs", exist_ok=True)
attempt = len(glob.glob("outputs/attempt-*"))
open(f"outputs/attempt-{attempt}", "w").close()
mlflow.log_metric("attempt", attempt, step=attempt)
print(f"attempt {attempt}", flush=True)
while attempt == 0:
    time.sleep(0.05)
"""


def _history(client: Any, run_id: str, key: str) -> list[tuple[int, float, int]]:
    return sorted((m.step, m.value, m.timestamp) for m in client.get_metric_history(run_id, key))


def _show(emu: Emulator, run: Run, *extra: str) -> str:
    result = CliRunner().invoke(cli, ["--home", str(emu.home.root), "job", "show", run.id, *extra])
    assert result.exit_code == 0, result.output
    return result.output


# --- the plot --------------------------------------------------------------------------------------
def test_plot_metrics_writes_a_png_with_a_subplot_per_metric(tmp_path: Path) -> None:
    import matplotlib.image  # noqa: PLC0415

    two = plot_metrics({"loss": [(0, 1.0), (1, 0.5), (2, float("inf"))], "acc": [(0, 0.1)], "empty": []},
                       tmp_path / "two.png", "run a")
    five = plot_metrics({f"m{i}": [(s, s * i) for s in range(100)] for i in range(5)},
                        tmp_path / "sub" / "five.png", "run b")
    assert two == tmp_path / "two.png" and five == tmp_path / "sub" / "five.png"
    for path in (two, five):
        assert path.read_bytes()[:8] == PNG_SIGNATURE and path.stat().st_size > 5000
    # The figure grows with its subplots: 2 metrics in one column, 5 in a 2 x 3 grid (100 dpi).
    assert matplotlib.image.imread(two).shape == (580, 640, 4)
    assert matplotlib.image.imread(five).shape == (840, 1280, 4)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["five.png", "sub", "two.png"]  # no partial file


def test_plot_metrics_returns_none_for_nothing_to_plot(tmp_path: Path) -> None:
    assert plot_metrics({}, tmp_path / "a.png", "t") is None
    assert plot_metrics({"loss": []}, tmp_path / "b.png", "t") is None
    assert list(tmp_path.iterdir()) == []


def test_a_failure_to_plot_is_logged_not_raised(tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    emu = Emulator(home=tmp_path / "home", backend="process")
    emu.store.add_run("r1", "exp", "c1", {})
    run_dir = emu.home.run_dir("r1")
    run_dir.mkdir(parents=True)
    empty_store(template_path(), run_dir / "mlflow.db")  # a copy: MLflow's migrations of a new store take seconds
    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    mlrun = client.create_run(client.create_experiment("exp"))
    client.log_metric(mlrun.info.run_id, "loss", 0.5, step=0)
    log: list[str] = []
    assert plot_run(run_dir, "r1 (exp): Completed", log.append) == run_dir / PLOT_NAME
    assert log == [f"metrics plotted: {run_dir / PLOT_NAME}"]
    (run_dir / PLOT_NAME).unlink()
    (run_dir / PLOT_NAME / "in-the-way").mkdir(parents=True)  # the PNG cannot be put in place
    assert plot_run(run_dir, "r1 (exp): Failed", log.append) is None
    assert log[-1].startswith("warning: could not plot the run's metrics: ")
    assert sorted(p.name for p in run_dir.iterdir()) == ["metrics.png", "mlflow.db"]  # no partial file
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "mlflow.db").write_text("not a database")
    assert plot_run(broken, "r2: Failed", log.append) is None
    assert "DatabaseError" in log[-1]


# --- runs keep their plot --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory, _homes: set[str]) -> Iterator[tuple[Emulator, Run]]:
    """A completed run of LOGS on a process cluster, which the tests marked LOGGED only read: one
    job for them all, on one xdist worker. Process nodes: the plot is drawn on the host from the
    run's merged store, the same on both backends (a docker node's MLflow store reaching the run:
    test_cluster's single-node job)."""
    root = tmp_path_factory.mktemp("logged")
    emu = Emulator(home=root / "home", backend="process")
    _homes.add(emu.home.id)
    try:
        emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1, idle_seconds_before_scaledown=0))
        run = emu.submit(JobFactory(root / "jobs")(LOGS, distribution="none"))
        assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
        # Drawn before the status is set: whoever sees the run ended finds its plot, without waiting.
        assert (run.dir / PLOT_NAME).is_file(), "the run was seen ended before its plot was drawn"
        yield emu, run
    finally:
        emu.cleanup()
    assert_nothing_left(emu, "process")


LOGGED = pytest.mark.xdist_group("metrics-logged")


@pytest.mark.slow
@LOGGED
def test_a_run_keeps_a_plot_and_job_show_lists_it(logged: tuple[Emulator, Run], tmp_path: Path) -> None:
    emu, run = logged
    plot = run.dir / PLOT_NAME
    assert run.plot_path == plot and plot.read_bytes()[:8] == PNG_SIGNATURE
    assert f"metrics plotted: {plot}" in (run.dir / "system_logs" / "lifecycle.txt").read_text()
    shown = json.loads(_show(emu, run, "-o", "json"))
    assert shown["amlemu"]["metrics"] == {"loss": pytest.approx(1 / 3), "accuracy": pytest.approx(0.9)}
    assert shown["amlemu"]["plot"] == str(plot)
    assert f"plot: {plot}" in _show(emu, run)
    result = CliRunner().invoke(cli, ["--home", str(emu.home.root), "job", "download", run.id,
                                      "--download-path", str(tmp_path / "dl")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "dl" / run.id / PLOT_NAME).read_bytes() == plot.read_bytes()


@pytest.mark.slow
@PROCESS
def test_a_failed_run_is_plotted_and_a_run_without_metrics_is_not(emu: Emulator, cluster, make_job) -> None:
    cluster()
    failed = emu.submit(make_job(LOGS, distribution="none", args="3"))
    quiet = emu.submit(make_job("print('no metrics here', flush=True)\n", distribution="none"))
    assert failed.wait(timeout=120) is RunStatus.FAILED
    assert quiet.wait(timeout=120) is RunStatus.COMPLETED, quiet.record.error
    assert failed.plot_path is not None and failed.plot_path.read_bytes()[:8] == PNG_SIGNATURE
    assert json.loads(_show(emu, failed, "-o", "json"))["amlemu"]["metrics"]["loss"] == pytest.approx(1 / 3)
    assert quiet.plot_path is None and not (quiet.dir / PLOT_NAME).exists()
    shown = json.loads(_show(emu, quiet, "-o", "json"))
    assert shown["amlemu"]["plot"] is None and shown["amlemu"]["metrics"] == {}
    assert "plot:" not in _show(emu, quiet)


@pytest.mark.slow
@PROCESS
def test_a_preempted_run_plots_every_attempt(emu: Emulator, cluster, make_job) -> None:
    cluster(max_nodes=1, vm_priority="lowpriority")
    run = emu.submit(make_job(ATTEMPTS, distribution="none"))
    wait_until(lambda: "attempt 0" in run.logs(0) and run.status is RunStatus.RUNNING, STARTUP, "attempt 0 running")
    assert run.plot_path is None  # not while it runs
    emu.faults.preempt("c1", node=0)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    assert run.record.preemptions == 1
    assert run.metric_history() == {"attempt": [(0, 0.0), (1, 1.0)]}  # appended across attempts
    assert run.plot_path is not None and run.plot_path.read_bytes()[:8] == PNG_SIGNATURE
    lifecycle = (run.dir / "system_logs" / "lifecycle.txt").read_text()
    assert lifecycle.count("metrics plotted") == 1  # once, at the end, not at the preemption


# --- merging a node's store into the run's record -------------------------------------------------
def test_merge_store_copies_what_ranks_logged_as_mlflow_reads_it(tmp_path: Path) -> None:
    from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    node, record = tmp_path / "node.db", tmp_path / "record" / "mlflow.db"
    seed_store(node, "exp", "jobrun", "jobrun", template_path())
    client = MlflowClient(tracking_uri=f"sqlite:///{node}")
    client.update_run("jobrun", status="RUNNING")  # rank 0 attached to the job's run and died: KILLED
    client.log_batch("jobrun", metrics=[Metric("loss", v, 1000 + i, i) for i, v in enumerate([1.0, float("nan"), 0.25])],
                     params=[Param("lr", "0.1")], tags=[RunTag("mine", "x")])
    child = client.create_run(client.create_experiment("other"), run_name="child",
                              tags={"mlflow.parentRunId": "jobrun"}).info.run_id
    client.log_metric(child, "acc", 0.9, step=3)
    client.set_terminated(child, "FINISHED", end_time=5000)
    deleted = client.create_run(client.get_experiment_by_name("exp").experiment_id).info.run_id
    client.delete_run(deleted)

    assert merge_store(node, record, template_path()) == 2
    assert merge_store(node, record, template_path()) == 2  # a second attempt's store: runs of their own
    merged = MlflowClient(tracking_uri=f"sqlite:///{record}")
    found = merged.search_runs([e.experiment_id for e in merged.search_experiments()])
    assert sorted(r.info.run_name for r in found) == ["child", "child", "jobrun", "jobrun"]
    assert len({r.info.run_id for r in found} | {"jobrun", child}) == 6  # new ids, none reused
    job = next(r for r in found if r.info.run_name == "jobrun")
    assert job.info.status == "KILLED" and job.info.end_time is not None
    assert job.data.params == {"lr": "0.1"} and job.data.tags["mine"] == "x" and SEED_TAG not in job.data.tags
    assert merged.get_experiment(job.info.experiment_id).name == "exp"

    def points(of: Any, run_id: str) -> list[tuple[int, str, int]]:  # NaN as text: nan != nan
        return [(step, repr(value), at) for step, value, at in _history(of, run_id, "loss")]

    assert points(merged, job.info.run_id) == points(client, "jobrun") and len(points(client, "jobrun")) == 3
    assert job.data.metrics["loss"] == 0.25  # the latest point, as MLflow reads it
    copy = next(r for r in found if r.info.run_name == "child")
    assert (copy.info.status, copy.info.end_time) == ("FINISHED", 5000) and "mlflow.parentRunId" not in copy.data.tags
    assert merged.get_experiment(copy.info.experiment_id).name == "other"
    assert [(m.step, m.value) for m in merged.get_metric_history(copy.info.run_id, "acc")] == [(3, 0.9)]


def test_merge_store_skips_a_store_no_process_logged_to(tmp_path: Path) -> None:
    node = tmp_path / "node.db"
    seed_store(node, "exp", "jobrun", "jobrun", template_path())
    assert merge_store(node, tmp_path / "record.db", template_path()) == 0
    assert not (tmp_path / "record.db").exists()


# --- one store for MLflow's UI ---------------------------------------------------------------------
@pytest.mark.slow
@PROCESS
def test_build_ui_store_copies_each_run_once_and_refreshes_active_ones(emu: Emulator, cluster, make_job,
                                                                      tmp_path: Path) -> None:
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    cluster()
    done = emu.submit(make_job(LOGS, distribution="none"))
    active = emu.submit(make_job(STEPWISE, distribution="none"))
    assert done.wait(timeout=120) is RunStatus.COMPLETED, done.record.error
    wait_until(lambda: "step 0 logged" in active.logs(0), STARTUP, "the second run logged step 0")
    dest = tmp_path / "ui" / "mlflow.db"
    assert build_ui_store(emu, dest) == 2
    client = MlflowClient(tracking_uri=f"sqlite:///{dest}")

    def copies() -> dict[str, Any]:
        experiments = [e.experiment_id for e in client.search_experiments()]
        found = client.search_runs(experiments)
        assert len(found) == len({r.data.tags[UI_RUN_TAG] for r in found}), "a run was copied twice"
        return {r.data.tags[UI_RUN_TAG]: r for r in found}

    first = copies()
    assert sorted(first) == sorted([done.id, active.id])
    copy = first[done.id]
    assert copy.info.run_name == done.id and copy.info.status == "FINISHED"
    assert copy.data.tags[UI_STATUS_TAG] == "Completed"
    assert client.get_experiment(copy.info.experiment_id).name == done.record.experiment
    source = MlflowClient(tracking_uri=f"sqlite:///{done.dir / 'mlflow.db'}")
    [original] = source.search_runs([e.experiment_id for e in source.search_experiments()])
    for key in ("loss", "accuracy"):  # every point, with its step and timestamp
        assert _history(client, copy.info.run_id, key) == _history(source, original.info.run_id, key)
    assert [s for s, _, _ in _history(client, copy.info.run_id, "loss")] == [0, 1, 2]
    assert [a.path for a in client.list_artifacts(copy.info.run_id)] == [PLOT_NAME]
    assert first[active.id].data.tags[UI_STATUS_TAG] == "Running" and first[active.id].info.status == "RUNNING"
    assert [(s, v) for s, v, _ in _history(client, first[active.id].info.run_id, "progress")] == [(0, 0.0)]

    release(emu, active)
    assert active.wait(timeout=60) is RunStatus.COMPLETED, active.record.error
    assert build_ui_store(emu, dest) == 1  # only the run that was active is brought up to date
    second = copies()
    refreshed = second[active.id]
    assert refreshed.info.run_id == first[active.id].info.run_id
    assert refreshed.data.tags[UI_STATUS_TAG] == "Completed" and refreshed.info.status == "FINISHED"
    assert [(s, v) for s, v, _ in _history(client, refreshed.info.run_id, "progress")] == [(0, 0.0), (1, 1.0)]
    assert build_ui_store(emu, dest) == 0
    assert sorted(copies()) == sorted(first)


# --- amlemu ui ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _api(port: int, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/{path}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as reply:
        return json.loads(reply.read())


def _gone(proc: psutil.Process) -> bool:
    try:
        return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
@LOGGED
def test_amlemu_ui_mlflow_serves_the_runs_and_stops_its_server_on_ctrl_c(logged: tuple[Emulator, Run],
                                                                        tmp_path: Path) -> None:
    emu, run = logged
    port = _free_port()
    out = tmp_path / "ui.out"
    with open(out, "w") as sink:
        proc = subprocess.Popen([str(Path(sys.executable).with_name("amlemu")), "--home", str(emu.home.root), "ui",
                                 "--mlflow", "--port", str(port)], stdout=sink, stderr=subprocess.STDOUT)
    family: list[psutil.Process] = []
    try:
        def served() -> dict[str, Any] | None:
            assert proc.poll() is None, f"amlemu ui exited: {out.read_text()}"
            try:
                experiments = [e["experiment_id"] for e in _api(port, "experiments/search", {"max_results": 100})
                               ["experiments"]]
                found = _api(port, "runs/search", {"experiment_ids": experiments,
                                                   "filter": f"tags.`{UI_RUN_TAG}` = '{run.id}'"})
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return None
            return (found.get("runs") or [None])[0]

        # The URL is printed once the server answers its health check: wait for it before asking.
        wait_until(lambda: f"http://127.0.0.1:{port}" in out.read_text(), 90, "amlemu ui printed its URL")
        served_run = wait_until(served, 30, "amlemu ui served the emulator's run")
        family = psutil.Process(proc.pid).children(recursive=True)
        assert any("mlflow" in " ".join(p.cmdline()) for p in family), [p.cmdline() for p in family]
        assert served_run["info"]["run_name"] == run.id
        metrics = {m["key"]: m["value"] for m in served_run["data"]["metrics"]}
        assert metrics == {"loss": pytest.approx(1 / 3), "accuracy": pytest.approx(0.9)}
        history = _api(port, f"metrics/get-history?run_id={served_run['info']['run_id']}&metric_key=loss")
        assert sorted(m["step"] for m in history["metrics"]) == [0, 1, 2]
        assert f"http://127.0.0.1:{port}" in out.read_text()

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=30) == 0, out.read_text()
        wait_until(lambda: all(_gone(p) for p in family), 15, "the MLflow server and its workers are gone")
        with pytest.raises(OSError):  # nothing listens any more
            _api(port, "experiments/search", {"max_results": 1})
    finally:  # a failed assertion must not leave what this test started running
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        for p in family:
            if not _gone(p):
                p.kill()


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "example.com"])
def test_amlemu_ui_refuses_a_non_loopback_host(tmp_path: Path, host: str) -> None:
    result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), "ui", "--host", host])
    assert result.exit_code == 1
    assert result.output.startswith(f"amlemu: error: --host: {host} is not a loopback address")
    assert result.output.count("\n") == 1 and "--allow-remote" in result.output


def test_amlemu_ui_names_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli, ["--home", str(tmp_path / "home"), "ui", "--port", str(port)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(f"amlemu: error: --port: cannot listen on 127.0.0.1:{port}")
