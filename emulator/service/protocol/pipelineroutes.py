"""Pipeline jobs on the service's routes (issue 29): a job PUT of `jobType: Pipeline` (azure-ai-ml's
`@dsl.pipeline` job) goes to the pipeline's submit (state/pipelinestate.py), any other to the sweep
dispatch (sweeproutes.put_job) and on to the state's; a job resource of a pipeline shows it as a
Pipeline job, its outputs where its steps wrote them. Its steps are child jobs: run history's
children (sweeproutes.run_children) list them, as azure-ai-ml's jobs.list(parent_job_name=) reads
them. A state with no emulator home behind it (the tests' double) has no pipelines: its job PUT
refuses them as it refuses any job type it does not run."""
from __future__ import annotations

from typing import Any

from amlemu.service.protocol import sweeproutes
from amlemu.service.protocol.calls import Call
from amlemu.service.state import pipelinerest


def put_job(call: Call, name: str) -> dict[str, Any]:
    """A job PUT: a pipeline's to its submit, any other to the sweep dispatch."""
    pipelines = getattr(call.st, "pipelines", None)  # the tests' double has none
    if pipelines is not None and pipelinerest.is_pipeline_body(call.body):
        return pipelines.put(name, call.body)
    return sweeproutes.put_job(call, name)


def shown(call: Call, name: str, props: dict[str, Any]) -> dict[str, Any]:
    """A job's REST props as the resource shows them: a pipeline's as a Pipeline job, a sweep's as a Sweep."""
    props = sweeproutes.shown(call, name, props)
    pipelines = getattr(call.st, "pipelines", None)  # the tests' double has none
    return props if pipelines is None else pipelines.properties(name, props)
