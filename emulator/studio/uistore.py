"""One MLflow store over every run, for MLflow's own UI (`amlemu ui --mlflow`): the home's store.

An online run (one started while `amlemu serve` ran) logged to the home's store itself, live, under
its own id (runs/homestore.py): it is served as it is, never copied. An offline run's ranks logged
to their nodes' sqlite stores (runs.metrics), which no MLflow server sees: build_ui_store copies
those into the home's store, incrementally, as runs tagged amlemu.run_id.
"""
from __future__ import annotations

import fcntl
from pathlib import Path
from typing import Any

from amlemu import skus
from amlemu.api import Emulator, Run
from amlemu.runs.homestore import store_path, template_path
from amlemu.runs.metrics import SKIP_TAGS, all_runs, chunks, empty_store
from amlemu.specs import RunStatus

UI_RUN_TAG = "amlemu.run_id"
UI_STATUS_TAG = "amlemu.status"
_MLFLOW_STATUS = {RunStatus.COMPLETED: "FINISHED", RunStatus.FAILED: "FAILED", RunStatus.CANCELED: "KILLED"}
_FINAL = {s.value for s in _MLFLOW_STATUS}


def _point(metric: Any) -> tuple[str, int, int, str]:
    # repr: NaN != NaN, and a point must compare equal to its own copy.
    return metric.key, metric.step, metric.timestamp, repr(metric.value)


def build_ui_store(emu: Emulator, dest: Path) -> int:
    """Copy every run's MLflow data (experiment, params, metrics with steps and timestamps, tags)
    into the sqlite store `dest`, one MLflow run per emulator run, named after it and tagged
    amlemu.run_id / amlemu.status. A run copied in a terminal state is not copied again; one that
    was still active is brought up to date. Returns how many runs were copied or refreshed."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if not dest.exists():  # from the machine's template: no MLflow migrations (seconds of CPU) per store
        empty_store(template_path(), dest, (dest.parent / "artifacts" / "0").as_uri())
    # Two `amlemu ui` starting at once must not both copy the same run.
    with open(dest.parent / ".copy.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _copy_runs(emu, dest)


def _copy_runs(emu: Emulator, dest: Path) -> int:
    from mlflow.entities import ViewType  # noqa: PLC0415
    from mlflow.tracking import MlflowClient  # noqa: PLC0415

    artifacts = (dest.parent / "artifacts").as_uri()
    client = MlflowClient(tracking_uri=f"sqlite:///{dest}")
    # Deleted copies count too: a run the user deleted in the UI is not brought back.
    found = all_runs(client, ViewType.ALL)
    copies = {r.data.tags[UI_RUN_TAG]: r for r in found if UI_RUN_TAG in r.data.tags}
    online = {r.info.run_id for r in found}  # an online run is there under its own id
    copied = 0
    for run in emu.runs():
        if run.id in online:
            continue
        status = run.status  # read before the data: a run ending meanwhile is refreshed next time
        previous = copies.get(run.id)
        if previous is not None and (previous.info.lifecycle_stage == "deleted"
                                     or previous.data.tags.get(UI_STATUS_TAG) in _FINAL):
            continue
        stores = []
        for db in run.metric_stores():
            source = MlflowClient(tracking_uri=f"sqlite:///{db}")
            found_runs = sorted(all_runs(source, ViewType.ACTIVE_ONLY), key=lambda r: r.info.start_time or 0)
            if found_runs:
                stores.append((source, found_runs))
        if not stores:
            continue  # the job logged nothing with MLflow
        source, sources = stores[0]
        experiment = source.get_experiment(sources[0].info.experiment_id).name
        if experiment == "Default":  # the job set no experiment of its own: the job's is meant
            experiment = run.record.experiment
        if previous is None:
            found = client.get_experiment_by_name(experiment)
            if found is not None and found.lifecycle_stage == "deleted":
                continue  # deleted in the UI: it stays deleted
            experiment_id = found.experiment_id if found else client.create_experiment(
                experiment, artifact_location=artifacts)
            target = client.create_run(experiment_id, start_time=sources[0].info.start_time,
                                       tags={UI_RUN_TAG: run.id}, run_name=run.id)
        else:
            target = previous
        for source, found_runs in stores:
            _copy_data(client, target.info.run_id, source, found_runs, run)
        plot = run.plot_path
        if plot is not None:
            client.log_artifact(target.info.run_id, str(plot))
        if status.is_terminal:
            ends = [r.info.end_time for _, found_runs in stores for r in found_runs if r.info.end_time]
            end = max(ends) if ends else int(run.events()[-1][0] * 1000)
            client.set_terminated(target.info.run_id, status=_MLFLOW_STATUS[status], end_time=end)
        # Last: a final status marks a complete copy, so a copy cut short is finished next time.
        client.set_tag(target.info.run_id, UI_STATUS_TAG, status.value)
        copied += 1
    return copied


def _copy_data(client: Any, target_id: str, source: Any, sources: list[Any], run: Run) -> None:
    """Params, tags and metric points of `sources` that `target_id` does not have yet."""
    from mlflow.entities import Metric, Param, RunTag  # noqa: PLC0415

    have = client.get_run(target_id).data
    params: dict[str, str] = {}
    tags = {"amlemu.compute": skus.shown_compute(run.record.cluster)}
    for src in sources:
        for key, value in src.data.params.items():
            params.setdefault(key, value)  # params are immutable: the first attempt's value stays
        tags.update({k: v for k, v in src.data.tags.items() if k not in SKIP_TAGS})
    new_params = [Param(k, v) for k, v in params.items() if k not in have.params]
    for chunk in chunks(new_params, 100):
        client.log_batch(target_id, params=chunk)
    for chunk in chunks([RunTag(k, str(v)) for k, v in tags.items()], 100):
        client.log_batch(target_id, tags=chunk)
    existing = {_point(m) for key in have.metrics for m in client.get_metric_history(target_id, key)}
    points: list[Any] = []
    for src in sources:
        for key in src.data.metrics:
            points += [Metric(m.key, m.value, m.timestamp, m.step)
                       for m in source.get_metric_history(src.info.run_id, key) if _point(m) not in existing]
    for chunk in chunks(points, 1000):
        client.log_batch(target_id, metrics=chunk)


def ui_store_path(emu: Emulator) -> Path:
    return store_path(emu.home.root)


