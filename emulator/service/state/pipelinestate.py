"""Pipeline jobs through the service (issue 29): a PUT of `jobType: Pipeline` (azure-ai-ml's
`@dsl.pipeline` job) becomes the `type: pipeline` YAML mapping (pipelinerest.py), read and checked
as `amlemu job create -f pipeline.yml` reads it, and submitted to its driver (emulator/pipelines/):
each step a child job `<pipeline>_<step>`, which run history's children list
(jobs.list(parent_job_name=...), protocol/sweeproutes.run_children). The pipeline reads back as the
body it was PUT with, its status the run's, its outputs where its steps wrote them; a pipeline the
CLI submitted reads back as a Pipeline job too, its steps from its YAML.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from amlemu import statefile
from amlemu.errors import AmlEmuError, ConfigError, NotFoundError, name_taken
from amlemu.pipelines.pipelinespec import pipeline_from_dict
from amlemu.pipelines.registry import Components
from amlemu.pipelines import stepio
from amlemu.pipelines.submit import DRIVER_LOG, from_record, is_pipeline_record, output_sources, read_steps
from amlemu.service.state import bad_request, componentstate, jobrest, pipelinerest

EXECUTION_LOG = "logs/azureml/executionlogs.txt"  # azure-ai-ml's PIPELINE_JOB_LOG_PATTERN

if TYPE_CHECKING:
    from amlemu.service.state.emulator import EmulatorState


class PipelineState:
    """EmulatorState's `pipelines`: what the routes (protocol/pipelineroutes.py) ask of a pipeline."""

    def __init__(self, state: EmulatorState) -> None:
        self.st = state
        self.components = componentstate.ComponentState(state)  # ml_client.components.*: what steps run

    def put(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        """A pipeline PUT: converted, read and checked as `job create` reads a pipeline YAML,
        submitted to its driver; its props."""
        saved = self.st._body_path(name)
        emu = self.st.emu
        if emu.store.run_exists(name):
            if saved.exists() and pipelinerest.same_pipeline(json.loads(saved.read_text()), body):
                return self.st.get_job(name)  # a re-PUT of the same pipeline (the SDK retries): it stands
            raise bad_request("name", str(name_taken(name)))
        try:
            data = pipelinerest.to_yaml(name, body, self.components.step_component)
            spec = pipeline_from_dict(data, base_dir=self.st.jobs_dir, components=Components(emu.store).resolve)
        except ConfigError as exc:
            raise jobrest.config_error(exc) from None
        statefile.write_json(saved, body)
        try:
            emu.submit(spec)
        except AmlEmuError as exc:
            saved.unlink(missing_ok=True)
            raise (jobrest.config_error(exc) if isinstance(exc, ConfigError) else bad_request("job", str(exc))) from None
        self.st.log(f"pipeline {name} submitted: steps {', '.join(spec.steps)}")
        return self.st.get_job(name)

    def properties(self, name: str, props: dict[str, Any]) -> dict[str, Any]:
        """A job's REST props (EmulatorState's): a pipeline's as a Pipeline job, its outputs' URIs
        where its steps wrote them; any other job's as they are."""
        try:
            record = self.st.emu.store.run(name)
        except NotFoundError:
            return props
        if not is_pipeline_record(record.job):
            return props
        yaml = record.job["pipeline"]["yaml"]
        if str(props.get("jobType")).lower() != "pipeline":  # the CLI's: no body was PUT
            props = {k: v for k, v in props.items() if k in pipelinerest.SHARED_PROPS}
            props.update(pipelinerest.from_yaml(self.st.workspace.id, yaml))
        return {**props, "outputs": pipelinerest.rest_outputs(props.get("outputs") or {}, self._written(record))}

    @staticmethod
    def log_aliases(job: dict[str, Any]) -> dict[str, str]:
        """A pipeline's driver log under the name azure-ai-ml's jobs.stream prints for a pipeline
        (Azure ML's execution log: each step started and ended); none for another job."""
        return {EXECUTION_LOG: f"system_logs/{DRIVER_LOG}"} if is_pipeline_record(job) else {}

    def log_path(self, name: str, path: str) -> str:
        """The run's file a log URL's path names: a pipeline's execution log is its driver's."""
        try:
            return self.log_aliases(self.st.emu.store.run(name).job).get(path, path)
        except NotFoundError:
            return path

    def output_uris(self, name: str) -> dict[str, str]:
        """jobs.download of a pipeline: each pipeline output bound to a step's, where it was written."""
        record = self.st.emu.store.run(name)
        if not is_pipeline_record(record.job):
            return {}
        return {k: v["path"].rstrip("/") for k, v in self._written(record).items()}

    def _written(self, record: Any) -> dict[str, dict[str, Any]]:
        """Where each pipeline output bound to a step's was written (pipeline.json's record of whose
        outputs stand for each step); none before the step started."""
        steps = (read_steps(self.st.home.run_dir(record.id)) or {}).get("steps") or []
        sources = output_sources(steps)
        if not sources:
            return {}
        try:
            spec = from_record(self.st.emu, record.job)
        except AmlEmuError:  # its component gone from the registry, say: the outputs as declared
            return {}
        return stepio.pipeline_outputs(spec, sources)
