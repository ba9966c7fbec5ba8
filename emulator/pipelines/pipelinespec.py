"""A pipeline job as users write it (`type: pipeline` in CLI v2 YAML), pure data: its steps (`jobs`,
keyed by step name: inline command jobs, components from a file, registered or inline, sweep steps
kept as written), the pipeline's inputs, outputs and settings, and every binding between them,
checked as az ml checks them (step names, references, types, cycles, compute). No I/O but reading
the YAML and the component files it names.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from amlemu import safeyaml
from amlemu.errors import ConfigError
from amlemu.jobs.jobyaml import KNOWN_FIELDS as COMMAND_FIELDS
from amlemu.jobs.jobyaml import apply_overrides
from amlemu.names import check_display_name, check_experiment_name, check_job_name
from amlemu.pipelines import pipelinecheck, stepcomponent
from amlemu.pipelines.componentjob import STEP_FIELDS as COMPONENT_STEP_FIELDS
from amlemu.pipelines.bindings import StepInput, StepOutput, StepOutputRef, check_type, parse_input, parse_output
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
    source: dict[str, Any] = field(default_factory=dict)  # the YAML as read (overrides applied): the record

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
        force_rerun=bool(data.get("force_rerun", False)),
        extra={k: v for k, v in data.items() if k not in SETTINGS_TYPED})


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
        steps=steps, inputs=_pipeline_ports(data, "inputs"), outputs=_pipeline_ports(data, "outputs"),
        settings=settings, base_dir=str(base_dir), compute=compute, name=check_job_name(data.get("name")),
        display_name=check_display_name(data.get("display_name")),
        experiment_name=None if data.get("experiment_name") is None else check_experiment_name(data["experiment_name"]),
        description=None if data.get("description") is None else str(data["description"]),
        tags={str(k): str(v) for k, v in _mapping(data.get("tags"), "tags").items()}, source=copy.deepcopy(data))
    pipelinecheck.check_pipeline(spec)
    return spec


def _pipeline_ports(data: dict[str, Any], kind: str) -> dict[str, Any]:
    """The pipeline's inputs (a value, or a mapping: type, path, mode) or outputs (a mapping, or nothing)."""
    found: dict[str, Any] = {}
    for name, value in _mapping(data.get(kind), kind).items():
        if kind == "outputs" or isinstance(value, dict):
            value = dict(_mapping(value, f"{kind}.{name}"))
            check_type(value.get("type"), f"{kind}.{name}.type")
        found[str(name)] = value
    return found


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
        node = {"type", "component", "inputs", "outputs", "comment", "$schema"}
        own = sorted(set(raw) - set(COMPONENT_STEP_FIELDS) - node)
        if own:
            raise ConfigError(f"{where}.{own[0]}", "is the component's, not the step's",
                              f"set it in the component, or leave component out and write the command job inline")


def _inline_job(name: str, raw: dict[str, Any], settings: PipelineSettings) -> dict[str, Any]:
    """An inline command step's own fields. Each names its environment: Azure ML has no pipeline-wide
    one (the preview's settings.environment went in CLI v2's 2022 schema; settings keep unknown keys)."""
    where = f"jobs.{name}"
    if not isinstance(raw.get("command"), str) or not raw["command"].strip():
        raise ConfigError(f"{where}.command", "missing", "give the step's command, or a component: ./component.yml")
    if raw.get("environment") is None:
        hint = " (settings.environment is not applied to steps, as in Azure ML)" if "environment" in settings.extra else ""
        raise ConfigError(f"{where}.environment", "missing", f"give the step's environment{hint}")
    return {k: v for k, v in raw.items() if k not in ("inputs", "outputs")}


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
    inputs = {str(k): parse_input(v, f"{where}.inputs.{k}")
              for k, v in _mapping(raw.get("inputs"), f"{where}.inputs").items()}
    outputs = {str(k): parse_output(v, f"{where}.outputs.{k}")
               for k, v in _mapping(raw.get("outputs"), f"{where}.outputs").items()}
    return Step(name, kind, job, inputs, outputs, compute, ref, component)
