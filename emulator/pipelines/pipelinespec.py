"""A pipeline job as users write it (`type: pipeline` in CLI v2 YAML), pure data: its steps (`jobs`,
keyed by step name: inline command jobs, components from a file, registered or inline, sweep steps
kept as written), the pipeline's inputs, outputs and settings, and every binding between them,
checked as az ml checks them (step names, references, types, cycles, compute). No I/O but reading
the YAML and the component files it names.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from amlemu import safeyaml
from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import KNOWN_FIELDS as COMMAND_FIELDS
from amlemu.jobs.jobyaml import apply_overrides
from amlemu.names import check_display_name, check_experiment_name, check_job_name
from amlemu.pipelines import stepcomponent
from amlemu.pipelines.componentjob import STEP_FIELDS as COMPONENT_STEP_FIELDS
from amlemu.pipelines.bindings import ParentInput, StepInput, StepOutput, StepOutputRef, Template, compatible, parse_input, parse_output
from amlemu.pipelines.graph import find_cycle
from amlemu.storage.datastores import DEFAULT as DEFAULT_DATASTORE
from amlemu.sweeps.sweepspec import SWEEP_FIELDS

PIPELINE_FIELDS = {
    "$schema", "type", "name", "display_name", "experiment_name", "description", "tags", "properties",
    "compute", "settings", "inputs", "outputs", "jobs", "identity",
}
SETTINGS_TYPED = {"default_compute", "default_datastore", "continue_on_step_failure", "force_rerun"}
# A step's fields (azure-ai-ml's CommandSchema node: a command job's, plus its component and comment).
STEP_FIELDS = (COMMAND_FIELDS - {"experiment_name"}) | {"component", "comment"}
SWEEP_STEP_FIELDS = (SWEEP_FIELDS - {"experiment_name"}) | {"comment"}
STEP_TYPES = ("command", "sweep")
NOT_EMULATED = ("parallel", "spark", "automl", "pipeline", "import", "data_transfer", "if_else", "do_while",
                "parallel_for", "flow")
NODE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")  # azure-ai-ml's is_valid_node_name
# Resolves a registered component (`azureml:<name>:<version>`, `@latest`) to its YAML mapping.
ComponentLookup = Callable[[str], Mapping[str, Any]]


@dataclass(frozen=True)
class ComponentRef:
    kind: str  # "file", "registered" or "inline"
    ref: str  # the file's absolute path, the `azureml:` reference, or "" for an inline one
    base_dir: str  # where the component's relative paths (code, environment files) start


@dataclass(frozen=True)
class Step:
    name: str
    type: str  # "command" or "sweep"
    job: dict[str, Any]  # the step's own fields as written, less inputs, outputs and component
    inputs: dict[str, StepInput]
    outputs: dict[str, StepOutput]
    compute: str  # the step's compute, else the pipeline's default: a cluster, `serverless` or `local`
    component_ref: ComponentRef | None = None  # None: an inline command job
    component: Any = None  # the loaded component (amlemu.pipelines.component), None if not resolved

    @property
    def upstream(self) -> tuple[str, ...]:
        """The steps whose outputs this step reads, in the order its inputs name them."""
        seen: dict[str, None] = {}
        for item in self.inputs.values():
            if isinstance(item.binding, StepOutputRef):
                seen.setdefault(item.binding.step)
        return tuple(seen)


@dataclass(frozen=True)
class PipelineSettings:
    default_compute: str | None = None
    default_datastore: str = DEFAULT_DATASTORE
    continue_on_step_failure: bool = False  # Azure ML's default: a failed step stops the pipeline
    force_rerun: bool = False
    default_environment: Any = None  # `settings.environment`: the steps' environment where they name none
    extra: dict[str, Any] = field(default_factory=dict)  # other settings, kept as written


@dataclass(frozen=True)
class PipelineSpec:
    steps: dict[str, Step]  # in the YAML's order
    inputs: dict[str, Any]  # each a literal value or a data input's mapping (type, path, mode)
    outputs: dict[str, dict[str, Any]]  # each a mapping (type, mode, path), empty for the defaults
    settings: PipelineSettings
    base_dir: str
    compute: str | None = None
    name: str | None = None
    display_name: str | None = None
    experiment_name: str | None = None
    description: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    def bound_outputs(self) -> dict[str, tuple[str, str]]:
        """Each pipeline output bound to a step's output: name -> (step, output)."""
        return {o.parent: (s.name, n) for s in self.steps.values() for n, o in s.outputs.items() if o.parent}


def load_pipeline(path: str | Path, overrides: list[str] | None = None, *,
                  components: ComponentLookup | None = None) -> PipelineSpec:
    path = Path(path)
    data = safeyaml.load_file(path, "-f", "job YAML")
    if overrides:
        data = apply_overrides(data if isinstance(data, dict) else {}, overrides)
    return pipeline_from_dict(data, base_dir=path.parent, components=components)


def is_pipeline_file(path: str | Path) -> bool:
    try:
        data = safeyaml.load_file(Path(path), "-f", "job YAML")
    except ConfigError:
        return False
    return isinstance(data, dict) and data.get("type") == "pipeline"


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(where, f"must be a mapping, got {type(value).__name__}")
    return value


def _compute_name(value: Any, where: str) -> str | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if not isinstance(value, str):
        raise ConfigError(where, f"{value!r:.60} is not a compute name", "write azureml:<cluster name> or serverless")
    name = value.strip().removeprefix("azureml:")
    return name.lower() if name.lower() in ("serverless", "local") else name


def _settings(value: Any) -> PipelineSettings:
    data = _mapping(value, "settings")
    for key in ("continue_on_step_failure", "force_rerun"):
        if key in data and not isinstance(data[key], bool):
            raise ConfigError(f"settings.{key}", f"must be true or false, got {data[key]!r}")
    datastore = str(data.get("default_datastore") or DEFAULT_DATASTORE).removeprefix("azureml:")
    return PipelineSettings(
        default_compute=_compute_name(data.get("default_compute"), "settings.default_compute"),
        default_datastore=datastore, continue_on_step_failure=bool(data.get("continue_on_step_failure", False)),
        force_rerun=bool(data.get("force_rerun", False)), default_environment=data.get("environment"),
        extra={k: v for k, v in data.items() if k not in SETTINGS_TYPED and k != "environment"})


def pipeline_from_dict(data: Any, *, base_dir: Path, components: ComponentLookup | None = None) -> PipelineSpec:
    """The pipeline, every step and binding checked; `components` resolves registered components
    (without it their ports are unknown, and the checks that need them pass)."""
    if not isinstance(data, dict) or data.get("type") != "pipeline":
        raise ConfigError("type", "this is not a pipeline job", "write type: pipeline")
    unknown = sorted(set(data) - PIPELINE_FIELDS)
    if unknown:
        raise ConfigError(unknown[0], "unknown field", f"a pipeline job's fields: {', '.join(sorted(PIPELINE_FIELDS))}")
    if "component" in data:
        raise ConfigError("component", "a pipeline made from a pipeline component is not emulated",
                          "write its steps under jobs:")
    settings = _settings(data.get("settings"))
    compute = _compute_name(data.get("compute"), "compute")
    jobs = _mapping(data.get("jobs"), "jobs")
    if not jobs:
        raise ConfigError("jobs", "missing", "give the pipeline's steps, each keyed by its name")
    default = settings.default_compute or compute
    steps = {name: _step(str(name), raw, base_dir, default, settings, components) for name, raw in jobs.items()}
    spec = PipelineSpec(
        steps=steps, inputs=dict(_mapping(data.get("inputs"), "inputs")),
        outputs={str(k): dict(_mapping(v, f"outputs.{k}")) for k, v in _mapping(data.get("outputs"), "outputs").items()},
        settings=settings, base_dir=str(base_dir), compute=compute, name=check_job_name(data.get("name")),
        display_name=check_display_name(data.get("display_name")),
        experiment_name=None if data.get("experiment_name") is None else check_experiment_name(data["experiment_name"]),
        description=None if data.get("description") is None else str(data["description"]),
        tags={str(k): str(v) for k, v in _mapping(data.get("tags"), "tags").items()})
    check_pipeline(spec)
    return spec


def _step_type(name: str, raw: dict[str, Any]) -> str:
    kind = str(raw.get("type", "command"))
    if kind in STEP_TYPES:
        return kind
    if kind in NOT_EMULATED:
        raise ConfigError(f"jobs.{name}.type", f"{kind} steps are not emulated", "use command or sweep steps")
    raise ConfigError(f"jobs.{name}.type", f"'{kind}' is not a step type", f"use one of: {', '.join(STEP_TYPES)}")


def _check_step_fields(name: str, kind: str, raw: dict[str, Any]) -> None:
    where = f"jobs.{name}"
    known = SWEEP_STEP_FIELDS if kind == "sweep" else STEP_FIELDS
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}", "unknown field", f"a {kind} step's fields: {', '.join(sorted(known))}")
    if kind == "command" and "component" in raw:  # what a step may set over its component (componentjob.py)
        own = sorted(set(raw) - set(COMPONENT_STEP_FIELDS) - {"type", "component", "inputs", "outputs", "comment", "$schema"})
        if own:
            raise ConfigError(f"{where}.{own[0]}", "is the component's, not the step's",
                              f"set it in the component, or leave component out and write the command job inline")


def _inline_job(name: str, raw: dict[str, Any], settings: PipelineSettings) -> dict[str, Any]:
    """An inline command step's own fields, its environment the pipeline's default where it names none."""
    where, job = f"jobs.{name}", {k: v for k, v in raw.items() if k not in ("inputs", "outputs")}
    if not isinstance(raw.get("command"), str) or not raw["command"].strip():
        raise ConfigError(f"{where}.command", "missing", "give the step's command, or a component: ./component.yml")
    if raw.get("environment") is None:
        if settings.default_environment is None:
            raise ConfigError(f"{where}.environment", "missing", "give the step's environment, or settings.environment "
                              "for every step")
        job["environment"] = settings.default_environment
    return job


def _step(name: str, raw: Any, base_dir: Path, default_compute: str | None, settings: PipelineSettings,
          components: ComponentLookup | None) -> Step:
    where = f"jobs.{name}"
    if not NODE_NAME.match(name):
        raise ConfigError(where, f"'{name}' is not a step name", "use lower-case letters, digits and _, starting with "
                          "a letter or _ (a Python identifier, as Azure ML requires)")
    if not isinstance(raw, dict):
        raise ConfigError(where, f"must be a mapping of the step's fields, got {type(raw).__name__}")
    kind = _step_type(name, raw)
    _check_step_fields(name, kind, raw)
    ref_field = "trial" if kind == "sweep" else "component"
    ref = stepcomponent.component_ref(raw.get(ref_field), f"{where}.{ref_field}", base_dir) if ref_field in raw else None
    if kind == "sweep" and ref is None:
        raise ConfigError(f"{where}.trial", "missing", "give the sweep step's trial: a command component (./train.yml)")
    component = stepcomponent.load_component(ref, raw.get(ref_field), f"{where}.{ref_field}", components) if ref else None
    job = _inline_job(name, raw, settings) if ref is None else \
        {k: v for k, v in raw.items() if k not in ("inputs", "outputs", "component")}
    compute = _compute_name(raw.get("compute"), f"{where}.compute") or default_compute
    if compute is None:
        raise ConfigError(f"{where}.compute", "compute not set: the step names none and the pipeline sets neither compute "
                          "nor settings.default_compute (az ml refuses this too)",
                          "name a cluster (compute: azureml:<cluster>), or write settings.default_compute: serverless")
    inputs = {str(k): parse_input(v, f"{where}.inputs.{k}") for k, v in _mapping(raw.get("inputs"), f"{where}.inputs").items()}
    outputs = {str(k): parse_output(v, f"{where}.outputs.{k}")
               for k, v in _mapping(raw.get("outputs"), f"{where}.outputs").items()}
    return Step(name, kind, job, inputs, outputs, compute, ref, component)


def declared_output_type(step: Step, output: str) -> str | None:
    """The type a step's output is declared with: its component's, or as written at an inline step."""
    declared = stepcomponent.output_types(step.component)
    if declared is not None:
        return declared.get(output)
    return step.outputs[output].type if output in step.outputs else None


def output_type(spec: PipelineSpec, step: Step, output: str) -> str | None:
    """The type of a step's output: as declared, else the pipeline output's it is bound up to, else
    Azure ML's default, uri_folder."""
    declared = declared_output_type(step, output)
    if declared or has_output(step, output) is not True:
        return declared
    parent = step.outputs[output].parent
    return str(spec.outputs.get(parent or "", {}).get("type") or "uri_folder")


def has_output(step: Step, output: str) -> bool | None:
    """None where it cannot be known (a registered component that was not resolved)."""
    if step.component_ref is not None and step.component is None:
        return None
    declared = stepcomponent.output_types(step.component)
    return output in (declared if declared is not None else step.outputs)


def input_type(step: Step, name: str) -> str | None:
    declared = stepcomponent.input_types(step.component)
    return step.inputs[name].data_type or (declared or {}).get(name)


def _pipeline_input_type(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("type") or ("uri_folder" if "path" in value else "")) or None
    return None


def check_pipeline(spec: PipelineSpec) -> None:
    """The bindings between steps and the pipeline: one line each, naming the step and field."""
    bound: dict[str, str] = {}
    for step in spec.steps.values():
        declared_in = stepcomponent.input_types(step.component)
        for name, item in step.inputs.items():
            where = f"jobs.{step.name}.inputs.{name}"
            if declared_in is not None and name not in declared_in:
                raise ConfigError(where, f"the step's component has no input '{name}'",
                                  f"its inputs: {', '.join(declared_in) or 'none'}")
            _check_input(spec, step, name, item, where)
        declared_out = stepcomponent.output_types(step.component)
        for name, out in step.outputs.items():
            where = f"jobs.{step.name}.outputs.{name}"
            if declared_out is not None and name not in declared_out:
                raise ConfigError(where, f"the step's component has no output '{name}'",
                                  f"its outputs: {', '.join(declared_out) or 'none'}")
            if out.parent is None:
                continue
            if out.parent not in spec.outputs:
                raise ConfigError(where, f"${{{{parent.outputs.{out.parent}}}}}: the pipeline has no output "
                                  f"'{out.parent}'", f"declare it under outputs: (its outputs: {', '.join(spec.outputs) or 'none'})")
            if out.parent in bound:
                raise ConfigError(where, f"the pipeline's output '{out.parent}' is already bound by jobs.{bound[out.parent]}",
                                  "bind each pipeline output to one step's output")
            bound[out.parent] = f"{step.name}.outputs.{name}"
            wanted, given = spec.outputs[out.parent].get("type"), declared_output_type(step, name)
            if not compatible(given, wanted):
                raise ConfigError(where, f"a {given} output bound to the pipeline's {wanted} output "
                                  f"'{out.parent}'", "make the two types the same")
    cycle = find_cycle({name: step.upstream for name, step in spec.steps.items()})
    if cycle:  # named at the input that closes it: the first step's, reading the last one's output
        closing = next(n for n, i in spec.steps[cycle[0]].inputs.items()
                       if isinstance(i.binding, StepOutputRef) and i.binding.step == cycle[-2])
        raise ConfigError(f"jobs.{cycle[0]}.inputs.{closing}", f"the steps form a cycle: {' -> '.join(cycle)}",
                          "a step may not read its own outputs, directly or through other steps")


def _check_input(spec: PipelineSpec, step: Step, name: str, item: StepInput, where: str) -> None:
    binding, wanted = item.binding, input_type(step, name)
    parents = [binding.name] if isinstance(binding, ParentInput) else list(binding.names) if isinstance(binding, Template) else []
    for parent in parents:
        if parent not in spec.inputs:
            raise ConfigError(where, f"${{{{parent.inputs.{parent}}}}}: the pipeline has no input '{parent}'",
                              f"declare it under inputs: (its inputs: {', '.join(spec.inputs) or 'none'})")
    if isinstance(binding, ParentInput):
        given = _pipeline_input_type(spec.inputs[binding.name])
        if not compatible(given, wanted):
            raise ConfigError(where, f"a {wanted} input bound to the pipeline's {given} input '{binding.name}'",
                              "make the two types the same")
    if not isinstance(binding, StepOutputRef):
        return
    ref = f"${{{{parent.jobs.{binding.step}.outputs.{binding.output}}}}}"
    source = spec.steps.get(binding.step)
    if source is None:
        raise ConfigError(where, f"{ref} names no step", f"the pipeline's steps: {', '.join(spec.steps)}")
    if has_output(source, binding.output) is False:
        known = stepcomponent.output_types(source.component)
        names = list(known) if known is not None else list(source.outputs)
        raise ConfigError(where, f"{ref}: step {binding.step} has no output '{binding.output}'",
                          f"its outputs: {', '.join(names) or 'none (declare one under its outputs:)'}")
    given = output_type(spec, source, binding.output)
    if not compatible(given, wanted):
        raise ConfigError(where, f"a {wanted} input bound to {binding.step}'s {given} output '{binding.output}'",
                          "make the two types the same")
