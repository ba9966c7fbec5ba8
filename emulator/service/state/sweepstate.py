"""Sweep jobs through the service (issue 28): a PUT of `jobType: Sweep` submitted as `amlemu job
create` submits a `type: sweep` YAML (sweeps/submit.py: the driver samples its trials `<sweep>_<n>`);
the sweep read back as a Sweep job with the properties Azure ML adds from its results (sweep.json);
its trials as run history's children (azure-ai-ml's jobs.list(parent_job_name=...)). The REST
shapes are sweeprest.py's; this is the glue to the emulator (EmulatorState, the store, the run folder).
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu import skus, statefile, validate
from amlemu.errors import AmlEmuError, ConfigError, NotFoundError, name_taken
from amlemu.service.state import bad_request, not_found, sweeprest
from amlemu.sweeps import results
from amlemu.sweeps.submit import submit
from amlemu.sweeps.sweepspec import is_sweep_record, sweep_from_dict, trial_field

if TYPE_CHECKING:
    from amlemu.service.state.emulator import EmulatorState


class SweepState:
    """EmulatorState's `sweeps`: what the routes (protocol/sweeproutes.py) ask of a sweep."""

    def __init__(self, state: EmulatorState) -> None:
        self.st = state

    def put(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A sweep PUT: converted, checked as `job validate` checks its trial, submitted; its props."""
        saved = self.st._body_path(name)
        if self.st.emu.store.run_exists(name):
            if saved.exists() and sweeprest.same_sweep(json.loads(saved.read_text()), body):
                return self.st.get_job(name)  # a re-PUT of the same sweep (the SDK retries): it stands
            raise bad_request("name", str(name_taken(name)))
        try:
            data = sweeprest.to_yaml(name, body, self.st._code_dir, self.st._environment)
            spec = sweep_from_dict(data, base_dir=Path((data.get("trial") or {}).get("code") or os.devnull))
        except ConfigError as exc:
            raise sweeprest.refusal(exc) from None
        assert spec.template is not None
        errors = [f for f in validate.check_job(spec.template) if f.severity == "error"]
        if errors:
            field = trial_field(errors[0].field)
            raise bad_request(field, f"{field}: {errors[0].problem}; {errors[0].fix}")
        statefile.write_json(saved, body)
        try:
            submit(self.st.emu, spec)
        except AmlEmuError as exc:
            saved.unlink(missing_ok=True)
            raise (sweeprest.refusal(exc) if isinstance(exc, ConfigError) else bad_request("job", str(exc))) from None
        self.st.log(f"sweep {name} submitted to compute {spec.compute}")
        return self.st.get_job(name)

    def properties(self, name: str, props: dict[str, Any]) -> dict[str, Any]:
        """A job's REST props (EmulatorState's): a sweep's as a Sweep job, with its results so far."""
        try:
            record = self.st.emu.store.run(name)
        except NotFoundError:
            return props
        if not is_sweep_record(record.job):
            return props
        summary = results.read(self.st.home.run_dir(record.id))
        return sweeprest.sweep_properties(props, record.job["sweep"]["yaml"], summary)

    def children(self, name: str) -> list[dict[str, Any]]:
        """The trials of sweep `name` (none for another job), as run history's Run, oldest first."""
        store = self.st.emu.store
        try:
            parent = store.run(name)
        except NotFoundError:
            raise not_found(f"run {name}") from None
        self.st.emu.reconcile()
        values = {t["name"]: t.get("values") for t in (results.read(self.st.home.run_dir(name)) or {}).get("trials", [])}
        return [sweeprest.child_run(r.id, parent=parent.id, status=r.status.value, experiment=r.experiment,
                                    compute=skus.shown_compute(r.cluster), display_name=r.job.get("display_name"),
                                    created=time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(r.created_at)),
                                    values=values.get(r.id))
                for r in store.runs(parent=name)]
