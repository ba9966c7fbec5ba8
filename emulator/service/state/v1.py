"""The SDK v1 side of the service's workspace, over the real emulator: experiments, the snapshot a
v1 submit sends (its zip, with AML_FORCE_EXECUTE_WITH_ZIP, which `amlemu env` sets) and `startrun`,
which reads the run configuration with the same reader as `emu.submit(ScriptRunConfig)`
(amlemu.jobs.convert) and submits through the same checks as a v2 job PUT (emustate.submit_spec).
"""
from __future__ import annotations

import dataclasses
import io
import json
import shutil
import threading
import time
import uuid
import zipfile
from pathlib import Path
from typing import Any

from amlemu import statefile
from amlemu.errors import ConfigError, NotFoundError
from amlemu.jobs.convert import job_from_run_config
from amlemu.names import JOB_NAME_RE, check_experiment_name
from amlemu.runs import runhistory
from amlemu.servicekeys import TENANT
from amlemu.runs.contract import experiment_guid
from amlemu.service.state import bad_request, not_found
from amlemu.service.state.v1history import History
from amlemu.service.state.v1hyperdrive import HyperDrive
from amlemu.service.state.v1snapshots import Snapshots

MAX_ZIP_BYTES = 300 * 1024 * 1024  # Azure ML's snapshot limit


def _iso(ts: float | None) -> str | None:
    return None if ts is None else time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))




class EmulatorV1:
    """What the v1 routes (v1routes.py) ask of the emulator state they belong to."""

    def __init__(self, state: Any, folder: Path) -> None:
        self.state = state
        self.folder = folder / "v1"
        self.code = self.folder / "code"  # each run's code, unpacked from the zip it was sent with
        self.code.mkdir(parents=True, exist_ok=True)
        self._experiments = self.folder / "experiments.json"
        self._lock = threading.Lock()
        self.history = History(self._history_dir)  # what a job's v1 Run sends: tags, metrics, files
        self.snapshots = Snapshots(self.folder / "snapshots", state.blobs)  # the client's code snapshots
        self.hyperdrive = HyperDrive(self)  # HyperDriveConfig submits: sweeps

    def _history_dir(self, run_id: str) -> Path:
        self.run_dto(None, run_id)  # the run exists (else a 404)
        return Path(self.state.home.run_dir(run_id))

    # --- experiments ---------------------------------------------------------------------------
    def _created(self) -> dict[str, float]:
        try:
            return dict(json.loads(self._experiments.read_text()))
        except (OSError, ValueError):
            return {}

    def experiments(self) -> list[dict[str, Any]]:
        created = self._created()
        for run in self.state.emu.store.runs():  # experiments of CLI and v2 runs exist too
            created.setdefault(run.experiment, run.created_at)
        return [self.experiment_dto(name, ts) for name, ts in sorted(created.items(), key=lambda kv: kv[1])]

    def experiment_id(self, name: str) -> str:
        """The GUID a run's AZUREML_EXPERIMENT_ID holds (runs.contract): one id on both sides."""
        return experiment_guid(self.state.emu.workspace(), name)

    def experiment_dto(self, name: str, created: float) -> dict[str, Any]:
        return {"experimentId": self.experiment_id(name), "name": name, "description": None,
                "createdUtc": _iso(created), "tags": {}}

    def get_experiment(self, name: str) -> dict[str, Any]:
        for exp in self.experiments():
            if exp["name"] == name:
                return exp
        raise not_found(f"experiment {name}")

    def create_experiment(self, name: str) -> dict[str, Any]:
        _check_experiment(name)
        with self._lock:
            created = self._created()
            created.setdefault(name, time.time())
            statefile.write_json(self._experiments, created)
        return self.get_experiment(name)

    # --- runs ----------------------------------------------------------------------------------
    def start_run(self, experiment: str, run_id: str, definition: Any, project_zip: bytes | None) -> dict[str, Any]:
        if not isinstance(definition, dict) or not isinstance(definition.get("Configuration"), dict):
            raise bad_request("runDefinitionFile", "runDefinitionFile: missing or not a run definition; "
                              "submit with azureml-core's Experiment.submit")
        _check_experiment(experiment)
        if project_zip is None:
            raise bad_request("projectZipFile", "projectZipFile: missing; set AML_FORCE_EXECUTE_WITH_ZIP=true "
                              "(`amlemu env` prints it): amlemu runs v1 jobs from the zip the SDK sends")
        code = self._unpack(run_id, project_zip)
        try:
            spec = job_from_run_config(definition["Configuration"], code, experiment_name=experiment)
        except ConfigError as exc:
            shutil.rmtree(code, ignore_errors=True)
            raise bad_request(exc.field, str(exc)) from None
        self.create_experiment(experiment)
        self.state.submit_spec(dataclasses.replace(spec, name=run_id, log_layout="v1"), {"properties": {
            "jobType": "Command", "command": spec.command, "experimentName": experiment, "v1": True}})
        return self.run_dto(experiment, run_id)

    def _unpack(self, run_id: str, data: bytes) -> Path:
        if len(data) > MAX_ZIP_BYTES:
            raise bad_request("projectZipFile", "projectZipFile: over Azure ML's 300 MB snapshot limit; "
                              "leave large files out with .amlignore")
        if not JOB_NAME_RE.match(run_id) or (self.code / run_id).exists():
            raise bad_request("runId", f"runId: '{run_id}' is taken or not a run id; leave run_id out")
        target = self.code / run_id
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                if sum(m.file_size for m in archive.infolist()) > MAX_ZIP_BYTES:  # what it unpacks to, too
                    raise bad_request("projectZipFile", "projectZipFile: unpacks to over Azure ML's 300 MB "
                                      "snapshot limit; leave large files out with .amlignore")
                for member in archive.infolist():
                    dest = (target / member.filename).resolve()
                    if not dest.is_relative_to(target.resolve()):  # no `..` out of the run's folder
                        raise bad_request("projectZipFile", f"projectZipFile: {member.filename} leaves the project")
                    if member.is_dir():
                        dest.mkdir(parents=True, exist_ok=True)
                        continue
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with archive.open(member) as src, dest.open("wb") as out:
                        shutil.copyfileobj(src, out)
        except zipfile.BadZipFile:
            raise bad_request("projectZipFile", "projectZipFile: not a zip file") from None
        target.mkdir(parents=True, exist_ok=True)
        return target

    def run_dto(self, experiment: str | None, run_id: str) -> dict[str, Any]:
        try:
            record = self.state.emu.store.run(run_id)
        except NotFoundError:
            raise not_found(f"run {run_id}") from None
        if experiment is not None and record.experiment != experiment:
            raise not_found(f"run {run_id} in experiment {experiment}")
        view = self.state.run_details(run_id)
        number = next((i for i, r in enumerate(self.state.emu.store.runs(), 1) if r.id == run_id), 0)
        error = {"error": {"code": "UserError", "message": view.error}} if view.error else None
        dto = {"runId": run_id, "runNumber": number, "runUuid": str(uuid.uuid5(uuid.NAMESPACE_URL, run_id)),
                "rootRunId": record.parent or run_id, "parentRunId": record.parent,  # a trial's: its sweep
                "experimentId": self.experiment_id(record.experiment), "status": view.status,
                "target": view.target, "startTimeUtc": _iso(view.start_time), "endTimeUtc": _iso(view.end_time),
                "createdUtc": _iso(record.created_at), "runType": "azureml.scriptrun",
                "dataContainerId": f"dcid.{run_id}",  # the artifact container of the run's files
                "name": run_id, "displayName": run_id, **runhistory.properties(self.state.home.run_dir(run_id)),
                "hidden": False,
                "createdBy": {"userName": "amlemu", "userObjectId": TENANT, "userTenantId": TENANT},
                "error": error, "warnings": []}
        return self.hyperdrive.shown(run_id, dto)  # a HyperDrive parent's as azureml-core reads it

    def children(self, experiment: str, run_id: str) -> list[dict[str, Any]]:
        """The child runs of a run (a sweep's trials), oldest first."""
        self.run_dto(experiment, run_id)
        return [self.run_dto(None, r.id) for r in self.state.emu.store.runs(parent=run_id)]

    def run_by_experiment_id(self, experiment_id: str, run_id: str) -> dict[str, Any]:
        """A run addressed as the SDK inside a job addresses it (AZUREML_EXPERIMENT_ID)."""
        dto = self.run_dto(None, run_id)
        if dto["experimentId"] != experiment_id:
            raise not_found(f"run {run_id} in experiment {experiment_id}")
        return dto

    def runs(self, experiment: str) -> list[dict[str, Any]]:
        return [self.run_dto(experiment, r.id) for r in self.state.emu.store.runs() if r.experiment == experiment]


def _check_experiment(name: str) -> None:
    """Azure ML's experiment name rule, before an experiment or its run is recorded."""
    try:
        check_experiment_name(name, "experimentName")
    except ConfigError as exc:
        raise bad_request(exc.field, str(exc)) from None
