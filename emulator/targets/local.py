"""The `emulator` target: the job runs on this machine's emulated AmlCompute."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from amlemu.actions import Action, execute
from amlemu.api import Emulator, Run
from amlemu.errors import ConfigError, NotFoundError, StateError
from amlemu import servicefile, skus
from amlemu.jobs import resource
from amlemu.jobs.sdkjobs import to_job
from amlemu.runs.contract import bindings, default_output_uri, workspace_arm_id
from amlemu.runs.metrics import PLOT_NAME
from amlemu.specs import ClusterSpec
from amlemu.pipelines import follow
from amlemu.pipelines import submit as pipelines
from amlemu.sweeps import results
from amlemu.sweeps import submit as sweeps
from amlemu.sweeps.sweepspec import is_sweep_record
from amlemu.targets import pipelinedownload
from amlemu.targets.base import JobSource, Plan, Target, WorkspaceOptions
from amlemu.validate import check_job

CANCEL_WAIT = 30.0  # seconds `cancel` waits for the run's supervisor to stop the job
DEFAULT_OUTPUT = "default"  # az ml's name for a job's logs and default output (`--output-name default`)


def run_data(run: Run, workspace: dict[str, str], home_root: Path, service_url: str | None) -> dict[str, Any]:
    """The job as `az ml job show` prints it (the Job resource `amlemu serve` returns, through the
    one serializer, jobs/resource.py), and amlemu's own facts under `amlemu`: the status history,
    the run's local folders, its error."""
    record, ws_id = run.record, workspace_arm_id(workspace)
    # Where an output without a path goes (read from the record as kept: a record that is no JobSpec still shows).
    outputs = {k: default_output_uri(run.id, k) for k in record.job.get("outputs") or {}}
    props = resource.job_properties(run.id, record.job, home_root=home_root, workspace_id=ws_id,
                                    compute=skus.rest_compute(record.cluster), experiment=record.experiment,
                                    status=record.status.value, output_uris=outputs)
    rest = resource.rest_resource(run.id, props, workspace_id=ws_id, created_at=record.created_at,
                                  service_url=service_url)
    extra = {"compute": skus.shown_compute(record.cluster), "code": record.job.get("code"), "error": record.error,
             "exit_code": record.exit_code,
             "outputs": str(run.outputs), "logs": str(run.log_path(0).parent),
             "history": [{"time": resource.iso(ts), "status": st.value, "detail": d} for ts, st, d in run.events()]}
    return {**resource.az_job(rest), "amlemu": extra}


class EmulatorTarget(Target):
    name = "emulator"

    def __init__(self, emulator: Emulator | None = None, **emulator_options: Any) -> None:
        self.emu = emulator or Emulator(**emulator_options)

    @classmethod
    def for_cli(cls, emulator: Callable[[], Any], workspace: WorkspaceOptions | None = None) -> Target:
        target = cls(emulator=emulator())
        if workspace is not None and workspace.given():
            workspace.check(target.emu.workspace())
        return target

    # --- jobs ----------------------------------------------------------------------------------
    def plan_job(self, job: JobSource, overrides: list[str] | None = None) -> Plan:
        """The emulator runs jobs AmlCompute would refuse (no environment, say): the findings of
        `amlemu job validate` go with the plan, for the CLI to show."""
        if sweeps.is_sweep(job):
            sweep = sweeps.load(job, overrides)
            return Plan(self.name, "job", sweeps.plan(self.emu, sweep), payload=sweep)
        if pipelines.is_pipeline(job):
            pipeline = pipelines.load(self.emu, job, overrides)
            return Plan(self.name, "job", pipelines.plan(self.emu, pipeline), payload=pipeline)
        spec = to_job(job, overrides)
        findings = [asdict(f) for f in check_job(spec)]
        return Plan(self.name, "job", {**self.emu.plan_job(spec), "findings": findings}, payload=spec)

    def run_job(self, plan: Plan) -> str:
        return self.emu.submit(plan.payload).id

    def status(self, name: str) -> str:
        self.emu.reconcile()
        return self.emu.run(name).status.value

    def show(self, name: str) -> dict[str, Any]:
        self.emu.reconcile()
        run = self.emu.run(name)
        shown = run_data(run, self.emu.workspace(), self.emu.home.root, self._service_url())
        plot = run.plot_path
        shown["amlemu"].update(metrics=run.metrics(), plot=str(plot) if plot else None)
        if is_sweep_record(run.record.job):  # its trials and best one, as az ml shows a sweep job
            summary = results.read(run.dir) or {}
            shown.update(type="sweep", properties={**(shown.get("properties") or {}), **summary.get("properties", {})})
            shown["amlemu"]["sweep"] = summary
        if pipelines.is_pipeline_record(run.record.job):  # its steps, each with its child job
            shown.update(type="pipeline")
            steps = pipelines.read_steps(run.dir) or {"steps": []}
            shown["amlemu"]["pipeline"] = {**steps, "outputs": pipelinedownload.written_outputs(
                self.emu, run, steps.get("steps") or [])}
        return shown

    def list_jobs(self, experiment: str | None = None, max_results: int | None = None,
                  parent: str | None = None) -> list[dict[str, Any]]:
        self.emu.reconcile()
        runs = self.emu.runs(experiment, parent=parent)  # oldest first
        if parent is None:  # as az ml job list: top-level jobs (a sweep's trials: --parent-job-name)
            runs = [r for r in runs if r.record.parent is None]
        if max_results is not None:
            runs = runs[max(len(runs) - max_results, 0):]
        workspace, url = self.emu.workspace(), self._service_url()
        return [run_data(r, workspace, self.emu.home.root, url) for r in runs]

    def _service_url(self) -> str | None:
        """The running `amlemu serve`'s address: the studio page a job's Studio endpoint is on."""
        state = servicefile.read_state(self.emu.home.root)
        return state.url if state else None

    def metrics(self, name: str) -> dict[str, float]:
        return self.emu.run(name).metrics()

    def stream(self, name: str) -> str:
        if pipelines.is_pipeline_record(self.emu.run(name).record.job):  # its steps' logs, in the order they start
            return follow.stream(self.emu, name).value
        return self.emu.run(name).wait(show_output=True).value

    def plan_cancel(self, name: str) -> list[Action]:
        return self.emu.plan_cancel(name)

    def cancel(self, name: str) -> str:
        execute(self.plan_cancel(name))
        return self.emu.run(name).wait(timeout=CANCEL_WAIT).value

    def plan_download(self, name: str, dest: Path, output_name: str | None = None,
                      everything: bool = False) -> list[Action]:
        """The default output (outputs, logs, the run's own logs and its metrics plot, copied by
        Run.download) and named outputs (read from their datastore URIs), as `az ml job download`
        chooses them."""
        run = self.emu.run(name)
        if is_sweep_record(run.record.job):  # az ml downloads a sweep's best trial's
            best = (results.read(run.dir) or {}).get("best_child_run_id")
            if not best:
                raise NotFoundError("best trial", name, message=f"sweep {name} has no best trial: none logged its primary "
                                    f"metric (see `amlemu job show {name}`); download a trial by its name")
            run, name = self.emu.run(best), best
        if Path(dest).exists() and not Path(dest).is_dir():
            raise ConfigError("--download-path", f"{dest} is a file", "give a folder (it is created if missing)")
        target = Path(dest) / name
        if target.exists() and not target.is_dir():
            raise ConfigError("--download-path", f"{target} is a file", "move it away or download elsewhere")
        if pipelines.is_pipeline_record(run.record.job):  # its own files, its outputs, with --all its steps'
            return pipelinedownload.plan(self, run, Path(dest), output_name, everything)
        outputs = {} if output_name in (None, DEFAULT_OUTPUT) and not everything else \
            {b.ref.split(".", 1)[1]: b.uri for b in bindings(run.job, name) if b.ref.startswith("outputs.")}
        if output_name not in (None, DEFAULT_OUTPUT, *outputs):
            raise NotFoundError("output", output_name, f"job {name} has: {', '.join([DEFAULT_OUTPUT, *outputs])}")
        plan = []
        if output_name in (None, DEFAULT_OUTPUT) or everything:
            plan.append(self.run_files(run, Path(dest)))
        wanted = outputs if everything else {k: v for k, v in outputs.items() if k == output_name}
        for out, uri in wanted.items():
            plan.append(self.named_output(out, uri, target / "named-outputs" / out, required=not everything))
        return plan

    @staticmethod
    def run_files(run: Run, dest: Path) -> Action:
        """The run's logs and default output, copied by Run.download into dest/<run>."""
        parts = [str(run.dir / sub) for sub in ("outputs", "logs", "user_logs", "azureml-logs", "system_logs", PLOT_NAME)
                 if (run.dir / sub).exists()]
        return Action("copy", "run files", run.id, {"from": parts, "to": str(dest / run.id)}, run=lambda: run.download(dest))

    def named_output(self, out: str, uri: str, to: Path, required: bool) -> Action:
        """A named output's download; one the job never wrote is an error when asked for by name,
        and skipped by --all (az ml skips it too)."""
        try:
            self.emu.datastores.plan_download(uri, to)
        except NotFoundError:
            if required:
                raise
            return Action("skip", "named output", out, {"from": uri, "why": "the job wrote nothing there"})
        return Action("download", "named output", out, {"from": uri, "to": str(to)},
                      run=lambda: self.emu.datastores.download(uri, to))

    # --- computes ------------------------------------------------------------------------------
    def plan_compute(self, spec: ClusterSpec) -> Plan:
        if any(c.spec.name == spec.name for c in self.emu.computes()):  # refused before any notice is printed
            raise StateError(f"compute '{spec.name}' already exists; delete it first or pick another name")
        return Plan(self.name, "compute", self.emu.plan_compute(spec), payload=spec)

    def run_compute(self, plan: Plan) -> None:
        self.emu.create_compute(plan.payload, plan.data["backend"])

    def show_compute(self, name: str) -> dict[str, Any]:
        cluster = self.emu.compute(name)
        nodes = self.emu.store.nodes(name)
        return {**cluster.spec.__dict__, "vm_priority": cluster.spec.vm_priority.value, "backend": cluster.backend,
                "busy": sum(n.state == "busy" for n in nodes), "idle": sum(n.state == "idle" for n in nodes),
                "nodes": [{"name": n.name, "state": n.state, "run": n.run_id, "address": n.address} for n in nodes]}

    def list_computes(self) -> list[dict[str, Any]]:
        return [self.show_compute(c.spec.name) for c in self.emu.computes()]

    def plan_delete_compute(self, name: str) -> list[Action]:
        return self.emu.plan_delete_compute(name)
