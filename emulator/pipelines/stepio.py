"""A pipeline step's inputs and outputs as its child job gets them, pure: where each output goes
(its own path, the pipeline output it is bound up to, or Azure ML's default
`azureml://datastores/<default datastore>/paths/azureml/<child job>/<output>/`), each input bound
(a pipeline input, a literal, another step's output at the place that step's child job wrote it),
and the command-job dict the step runs (read by jobs/jobyaml.py job_from_dict).
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from amlemu.errors import ConfigError
from amlemu.pipelines import graph
from amlemu.pipelines.bindings import Literal, ParentInput, StepOutput, StepOutputRef, Template
from amlemu.pipelines.pipelinecheck import output_type
from amlemu.pipelines.pipelinespec import PipelineSpec, Step

# What Azure ML puts in an output path: `${{name}}` the child job's name, `${{output_name}}` the
# output's, `${{default_datastore}}` the pipeline's default datastore.
MACROS = ("name", "output_name", "default_datastore")


def default_output_uri(datastore: str, child_job: str, output: str) -> str:
    """Azure ML's place for an output written without a path."""
    return f"azureml://datastores/{datastore}/paths/azureml/{child_job}/{output}/"


def expand_macros(path: str, child_job: str, output: str, datastore: str) -> str:
    values = {"name": child_job, "output_name": output, "default_datastore": datastore}
    for key in MACROS:
        path = path.replace(f"${{{{{key}}}}}", values[key])
    return path


def _declared_outputs(step: Step) -> dict[str, StepOutput]:
    """Every output the step writes: its component's (each as the step writes it, else the default),
    or an inline command step's own."""
    names = list(getattr(step.component, "outputs", None) or {}) or list(step.outputs)
    return {name: step.outputs.get(name, StepOutput()) for name in names}


def output_spec(spec: PipelineSpec, step_name: str, output: str, child_job: str) -> dict[str, Any]:
    """The output as the child job's `outputs.<output>`: type, mode (if any) and the datastore URI."""
    step = spec.steps[step_name]
    out = _declared_outputs(step).get(output)
    if out is None:
        raise ConfigError(f"jobs.{step_name}.outputs.{output}", "the step has no such output")
    datastore = spec.settings.default_datastore
    parent = spec.outputs.get(out.parent, {}) if out.parent else {}
    path = out.path or parent.get("path") or default_output_uri(datastore, child_job, output)
    mode = out.mode or parent.get("mode")
    found = {"type": output_type(spec, step, output) or "uri_folder",
             "path": expand_macros(str(path), child_job, output, datastore)}
    return {**found, **({"mode": str(mode)} if mode else {}), **out.extra}


def step_outputs(spec: PipelineSpec, step_name: str, child_job: str) -> dict[str, dict[str, Any]]:
    return {name: output_spec(spec, step_name, name, child_job) for name in _declared_outputs(spec.steps[step_name])}


def pipeline_outputs(spec: PipelineSpec, child_jobs: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each pipeline output bound to a step's: where that step's child job (`child_jobs[step]`) wrote it."""
    return {name: output_spec(spec, step, output, child_jobs[step])
            for name, (step, output) in spec.bound_outputs().items() if step in child_jobs}


def _local(value: Any, base_dir: str) -> Any:
    """A data input's mapping with a local relative path made absolute against the pipeline's folder
    (a component step's job is read from the component's folder)."""
    if not isinstance(value, dict) or not isinstance(value.get("path"), str):
        return value
    path = value["path"]
    if "://" in path or path.startswith(("azureml:", "/")):
        return dict(value)
    return {**value, "path": os.path.normpath(os.path.join(base_dir, os.path.expanduser(path)))}


def _parent_value(spec: PipelineSpec, name: str) -> Any:
    value = spec.inputs[name]
    if isinstance(value, dict) and "path" not in value and ("default" in value or "value" in value):
        return value.get("value", value.get("default"))
    return _local(value, spec.base_dir)


def bind_inputs(spec: PipelineSpec, step_name: str, child_jobs: Mapping[str, str]) -> dict[str, Any]:
    """The step's inputs with every binding resolved: `child_jobs` maps each step it reads to the
    child job whose outputs stand for it (its run, or the run it reuses)."""
    step, found = spec.steps[step_name], {}
    for name, item in step.inputs.items():
        binding = item.binding
        if isinstance(binding, ParentInput):
            value = _parent_value(spec, binding.name)
            found[name] = {**value, **({"mode": item.mode} if item.mode else {})} if isinstance(value, dict) else value
        elif isinstance(binding, StepOutputRef):
            if binding.step not in child_jobs:
                raise ConfigError(f"jobs.{step_name}.inputs.{name}", f"step {binding.step} has not run yet",
                                  "start a step only when graph.ready() names it")
            out = output_spec(spec, binding.step, binding.output, child_jobs[binding.step])
            found[name] = {"type": out["type"], "path": out["path"], **({"mode": item.mode} if item.mode else {})}
        elif isinstance(binding, Template):
            found[name] = binding.render({n: _parent_value(spec, n) for n in binding.names})
        else:
            assert isinstance(binding, Literal)
            found[name] = _local(binding.value, spec.base_dir)
    return found


def split_inputs(bound: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """Bound inputs as (parameters, data inputs): what the reuse key takes as values, and what it
    takes as content hashes."""
    params = {k: v for k, v in bound.items() if not isinstance(v, dict)}
    return params, {k: dict(v) for k, v in bound.items() if isinstance(v, dict)}


def step_job_dict(spec: PipelineSpec, step_name: str, child_job: str, child_jobs: Mapping[str, str]) -> dict[str, Any]:
    """The command-job dict the step's child job runs: an inline command step's own fields, or its
    component's job (amlemu.pipelines.component.to_job_dict) with the step's settings over it."""
    step = spec.steps[step_name]
    if step.type != "command":
        raise ConfigError(f"jobs.{step_name}.type", f"a {step.type} step is not one command job",
                          "run a sweep step as a sweep (emulator/sweeps/)")
    inputs, outputs = bind_inputs(spec, step_name, child_jobs), step_outputs(spec, step_name, child_job)
    named = {"display_name": step.job.get("display_name") or step_name,
             **({"experiment_name": spec.experiment_name} if spec.experiment_name else {})}
    if step.component_ref is None:
        own = {k: v for k, v in step.job.items() if k not in ("type", "comment", "$schema")}
        return {**own, **named, "type": "command", "inputs": inputs, "outputs": outputs, "compute": step.compute}
    if step.component is None:
        raise ConfigError(f"jobs.{step_name}.component", f"{step.component_ref.ref} was not resolved",
                          "load the pipeline with the registry's component lookup")
    from amlemu.pipelines.component import to_job_dict

    overrides = {k: v for k, v in step.job.items() if k not in ("type", "comment", "$schema", "compute")}
    try:
        return to_job_dict(step.component, inputs, outputs, step.compute, {**overrides, **named})
    except ConfigError as exc:
        raise ConfigError(f"jobs.{step_name}.{exc.field}", exc.problem, exc.fix) from None


# A step's fields that change the work it does, in its reuse key (its compute and names do not).
RUN_FIELDS = ("command", "distribution", "resources", "environment_variables")


def step_reuse_key(spec: PipelineSpec, step_name: str, *, code_hash: str | None, input_hashes: Mapping[str, str],
                   parameters: Mapping[str, Any]) -> str | None:
    """graph.reuse_key for a step: its component's content (an inline step's own command job
    stands for it), the step's fields over it, the pipeline's force_rerun and the component's
    is_deterministic. `code_hash`, `input_hashes`: the contents' hashes (the runner reads them);
    `parameters`: the literal inputs after binding (split_inputs)."""
    step = spec.steps[step_name]
    own = {k: step.job[k] for k in RUN_FIELDS if k in step.job}
    if step.component_ref is None:
        component: dict[str, Any] = {"type": "command", **own}
        environment, deterministic = step.job.get("environment"), True
    elif step.component is None:  # a registered component not resolved: its content is unknown
        return None
    else:
        component = step.component.to_dict()
        environment = getattr(step.component, "environment", None)
        deterministic = bool(getattr(step.component, "is_deterministic", True))
    return graph.reuse_key(component, code_hash=code_hash, environment=environment, input_hashes=input_hashes,
                           parameters=parameters, run_fields=own, is_deterministic=deterministic,
                           force_rerun=spec.settings.force_rerun)
