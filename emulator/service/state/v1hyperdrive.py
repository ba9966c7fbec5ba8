"""SDK v1 HyperDrive through the service (issue 28): `Experiment.submit(HyperDriveConfig(...))` becomes a
sweep job (sweeps/submit.py: a driver samples trials `<parent>_<n>`, child runs of the parent), its
trial read from the run configuration as a v1 startrun is (jobs/convert.py), its code the snapshot the
client created (v1snapshots.py); the parent shown to azureml-core's HyperDriveRun as a run of type
`hyperdrive` with the tags it reads (its config, each trial's hyperparameters). The shapes are
hyperdriverest.py's; this is the glue to the emulator (the v1 state, the store, the run folder).
"""
from __future__ import annotations

import json
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu import statefile, validate
from amlemu.errors import AmlEmuError, ConfigError
from amlemu.jobs.convert import job_from_run_config, job_yaml_dict
from amlemu.names import check_experiment_name
from amlemu.service.state import bad_request, hyperdriverest, not_found
from amlemu.sweeps import results
from amlemu.sweeps.submit import submit
from amlemu.sweeps.sweepspec import SweepSpec, sweep_from_dict, trial_field

if TYPE_CHECKING:
    from amlemu.service.state.v1 import EmulatorV1


class HyperDrive:
    """EmulatorV1's `hyperdrive`: what the hyperdrive routes (protocol/hyperdriveroutes.py) ask."""

    def __init__(self, v1: EmulatorV1) -> None:
        self.v1 = v1
        self.configs = v1.folder / "hyperdrive"  # each parent's config as the client sent it

    def _sweep(self, run_id: str, experiment: str, config: dict[str, Any]) -> SweepSpec:
        snapshot = hyperdriverest.snapshot_id(config)
        try:
            check_experiment_name(experiment, "experimentName")
            run_config = hyperdriverest.run_config(config)
            if snapshot is None:
                raise ConfigError("SnapshotId", "the config names no code snapshot",
                                  "give the ScriptRunConfig a source_directory")
            code = self.v1.snapshots.folder(snapshot)  # a 400 naming SnapshotId when it was not made here
            spec = job_from_run_config(run_config, code, experiment_name=experiment)
            data = hyperdriverest.to_yaml(run_id, config, job_yaml_dict(spec))
            sweep = replace(sweep_from_dict(data, base_dir=code), log_layout="v1")  # trials log as v1 runs do
        except ConfigError as exc:
            raise bad_request(exc.field, str(exc)) from None
        assert sweep.template is not None
        errors = [f for f in validate.check_job(sweep.template) if f.severity == "error"]
        if errors:
            field = trial_field(errors[0].field)
            raise bad_request(field, f"{field}: {errors[0].problem}; {errors[0].fix}")
        return sweep

    def create(self, experiment: str, raw: bytes) -> dict[str, Any]:
        """A HyperDrive parent run from the multipart `config` file: submitted, or a one-line 400."""
        try:
            config = hyperdriverest.parse_config(raw)
        except ConfigError as exc:
            raise bad_request(exc.field, str(exc)) from None
        run_id = f"HD_{uuid.uuid4()}"  # Azure ML's form; the trials are HD_<guid>_<n>
        sweep = self._sweep(run_id, experiment, config)
        saved = self.configs / f"{run_id}.json"
        statefile.write_json(saved, config)
        self.v1.create_experiment(experiment)
        try:
            submit(self.v1.state.emu, sweep)
        except AmlEmuError as exc:
            saved.unlink(missing_ok=True)
            raise bad_request(getattr(exc, "field", "config"), str(exc)) from None
        self.v1.state.log(f"hyperdrive run {run_id} submitted to compute {sweep.compute}")
        return hyperdriverest.response(run_id, experiment, config)

    def config(self, run_id: str) -> dict[str, Any] | None:
        """The config a HyperDrive parent was submitted with; None for any other run."""
        if "/" in run_id or run_id.startswith("."):
            return None
        try:
            found = json.loads((self.configs / f"{run_id}.json").read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def cancel(self, run_id: str) -> dict[str, Any]:
        if self.config(run_id) is None:
            raise not_found(f"hyperdrive run {run_id}")
        self.v1.state.cancel_job(run_id)  # the sweep's cancel cancels its active trials
        return {"code": 200, "result": f"cancellation of {run_id} requested"}

    def shown(self, run_id: str, dto: dict[str, Any]) -> dict[str, Any]:
        """A run's v1 dto; a HyperDrive parent's as a `hyperdrive` run with its tags and results."""
        config = self.config(run_id)
        if config is None:
            return dto
        summary = results.read(Path(self.v1.state.home.run_dir(run_id))) or {}
        tags = {**dto.get("tags", {}), **hyperdriverest.parent_tags(run_id, config, summary.get("trials") or [])}
        props = {**dto.get("properties", {}), "azureml.runsource": "hyperdrive", "runTemplate": "HyperDrive",
                 "platform": str(config.get("platform") or "AML"),
                 **{k: str(v) for k, v in (summary.get("properties") or {}).items()},
                 "generator_config": json.dumps(config.get("generator_config"))}  # v1's form, its names
        return {**dto, "runType": "hyperdrive", "tags": tags, "properties": props}
