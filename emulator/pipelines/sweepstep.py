"""A pipeline's sweep step (`type: sweep` under `jobs:`, its `trial` a command component from a file,
registered or inline), as Azure ML runs one: a sweep job (emulator/sweeps/) named `<pipeline>_<step>`,
so that its trials are `<pipeline>_<step>_<n>`, child of the pipeline. Its trial is the component's
command job with the step's bound inputs, and the search space is over the component's inputs: each
`${{inputs.<x>}}` of a hyperparameter becomes `${{search_space.<x>}}` (a value the step binds for a
hyperparameter is the search space's to give). Each trial writes its outputs at its own default
place (`.../paths/azureml/<trial>/<output>/`), and the step's outputs are its best trial's: when the
sweep completes the driver binds the dependents to that trial (`best_trial`).

`check_step` is pure (the step's sweep fields parsed as emulator/sweeps/ parses a sweep job's, each
refusal naming `jobs.<step>.<field>`); `sweep_job` reads the component's code folder only as a
command job's reader does; `submit`, `first_job` and `best_trial` act on the workspace.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from amlemu.errors import ConfigError
from amlemu.pipelines.porttypes import PARAM_TYPES, check_value
from amlemu.sweeps import policies
from amlemu.sweeps.limits import Objective, SweepLimits
from amlemu.sweeps.sampling import parse_sampling, validate_sampling
from amlemu.sweeps.space import Branch, Choice, SearchSpace, parse_space

if TYPE_CHECKING:
    from amlemu.api import Emulator
    from amlemu.pipelines.pipelinespec import PipelineSpec, Step
    from amlemu.specs import JobSpec
    from amlemu.sweeps.sweepspec import SweepSpec

# The step's fields that are the sweep's (the rest: its trial, inputs, outputs, compute, names).
SWEEP_KEYS = ("search_space", "sampling_algorithm", "objective", "limits", "early_termination")
SHARED_KEYS = ("description", "tags", "resources", "queue_settings", "identity")  # passed to the sweep as written
REQUIRED = {
    "search_space": "give each hyperparameter's distribution over the trial's inputs, e.g. "
                    "lr: {type: uniform, min_value: 0.001, max_value: 0.1}",
    "sampling_algorithm": "write random, grid or bayesian",
    "objective": "give goal (maximize or minimize) and primary_metric",
    "limits": "give limits.max_total_trials (and max_concurrent_trials, timeout)",
}
TRIAL_NAME = "${{name}}"  # each trial's output path names the trial (sweepspec.trial_job expands it)
_INPUT_REF = re.compile(r"\$\{\{\s*inputs\.([A-Za-z_]\w*)\s*\}\}")


def _named(step: str, exc: ConfigError) -> ConfigError:
    field = exc.field if exc.field.startswith("jobs.") else f"jobs.{step}.{exc.field}"
    return ConfigError(field, exc.problem, exc.fix)


def _space(step: Step) -> SearchSpace:
    try:
        return parse_space(step.job.get("search_space"))
    except ConfigError as exc:
        raise _named(step.name, exc) from None


def check_step(step: Step) -> None:
    """The sweep's fields as a sweep job's are checked (space, sampling, objective, limits, early
    termination), and each hyperparameter a literal input of the trial's component whose choices
    fit its type, min/max and enum (a registered component not resolved: its inputs are not known)."""
    where = f"jobs.{step.name}"
    for key, fix in REQUIRED.items():
        if step.job.get(key) is None:
            raise ConfigError(f"{where}.{key}", "missing", fix)
    space = _space(step)
    try:
        sampling = parse_sampling(step.job["sampling_algorithm"])
        validate_sampling(sampling, space)
        Objective.from_yaml(step.job["objective"])
        SweepLimits.from_yaml(step.job["limits"])
        policy = policies.policy_from_yaml(step.job.get("early_termination"))
    except ConfigError as exc:
        raise _named(step.name, exc) from None
    if policy is not None and sampling.type == "bayesian":
        raise ConfigError(f"{where}.early_termination", "bayesian sampling does not support early termination "
                          "(Azure ML's rule)", "remove early_termination, or use random or grid sampling")
    ports = getattr(step.component, "inputs", None)
    if ports is None:
        return
    for name, dist in space.params:
        field, port = f"{where}.search_space.{name}", ports.get(name)
        if port is None:
            raise ConfigError(field, f"the trial component has no input '{name}'",
                              f"the search space is over its inputs: {', '.join(ports) or 'none'}")
        if port.type not in PARAM_TYPES:
            raise ConfigError(field, f"'{name}' is a {port.type} input: a search space samples values, not data",
                              f"sweep over its {', '.join(PARAM_TYPES)} inputs")
        for value in dist.values if isinstance(dist, Choice) else ():
            if isinstance(value, Branch):
                raise ConfigError(field, "a conditional choice's option is a mapping: an input takes one value",
                                  "give the choice scalar values, or one hyperparameter per input")
            check_value(name, port.type, value, low=port.min, high=port.max, enum=port.enum, field=field)


def space_command(command: str, names: tuple[str, ...]) -> str:
    """The trial's command: `${{inputs.<x>}}` of each hyperparameter x as `${{search_space.<x>}}`."""
    return _INPUT_REF.sub(lambda m: f"${{{{search_space.{m.group(1)}}}}}" if m.group(1) in names else m.group(0),
                          command)


def sweep_dict(spec: PipelineSpec, step_name: str, pipeline: str, sources: Mapping[str, str]) -> dict[str, Any]:
    """The sweep job's YAML mapping (as `az ml job create -f` reads a sweep): `sources` maps each step
    this one reads to the job whose outputs stand for it."""
    from amlemu.pipelines import stepio
    from amlemu.pipelines.component import _placeholder, to_job_dict
    from amlemu.sweeps.sweepspec import TRIAL_FIELDS

    step = spec.steps[step_name]
    if step.component is None:
        raise ConfigError(f"jobs.{step_name}.trial", f"{getattr(step.component_ref, 'ref', '')} was not resolved",
                          "load the pipeline with the registry's component lookup")
    names = _space(step).names
    given = {**stepio.bind_inputs(spec, step_name, sources),  # stand-ins for the hyperparameters, dropped below
             **{n: _placeholder(step.component.inputs[n]) for n in names if n in step.component.inputs}}
    try:
        job = to_job_dict(step.component, given, stepio.step_outputs(spec, step_name, TRIAL_NAME), step.compute)
    except ConfigError as exc:
        raise _named(step_name, exc) from None
    trial = {k: v for k, v in job.items() if k in TRIAL_FIELDS}
    trial["command"] = space_command(str(job["command"]), names)
    return {"type": "sweep", "name": f"{pipeline}_{step_name}", "display_name": step.job.get("display_name") or step_name,
            **({"experiment_name": spec.experiment_name} if spec.experiment_name else {}),
            "compute": job.get("compute"), "inputs": {k: v for k, v in job["inputs"].items() if k not in names},
            "outputs": job["outputs"], "trial": trial,
            **{k: step.job[k] for k in SWEEP_KEYS + SHARED_KEYS if step.job.get(k) is not None}}


def sweep_job(spec: PipelineSpec, step_name: str, pipeline: str, sources: Mapping[str, str]) -> SweepSpec:
    """The sweep the step runs, read and checked as a sweep job is; its fields named at the step."""
    from amlemu.sweeps.sweepspec import sweep_from_dict

    data = sweep_dict(spec, step_name, pipeline, sources)
    try:
        return sweep_from_dict(data, base_dir=Path(spec.steps[step_name].component.base_dir))
    except ConfigError as exc:
        raise _named(step_name, exc) from None


def first_job(emu: Emulator, spec: PipelineSpec, step_name: str, pipeline: str) -> JobSpec:
    """A first step's trial job, checked by the workspace's rules as its sweep's submit checks it."""
    from amlemu.sweeps import submit as sweeps

    try:
        sweep = sweeps.checked(emu, sweep_job(spec, step_name, pipeline, {}))
    except ConfigError as exc:
        raise _named(step_name, exc) from None
    assert sweep.template is not None
    return emu._job(sweep.template)


def submit(emu: Emulator, spec: PipelineSpec, step_name: str, pipeline: str, sources: Mapping[str, str]) -> str:
    """Start the step's sweep (its driver samples the trials); its name, the step's child job."""
    from amlemu.sweeps import submit as sweeps

    return sweeps.submit(emu, sweep_job(spec, step_name, pipeline, sources), parent=pipeline).id


def best_trial(emu: Emulator, sweep: str) -> str | None:
    """The sweep's best trial, whose outputs are the step's, once it completed; None when no trial
    completed with the primary metric logged (there are no outputs to stand for the step's)."""
    from amlemu.sweeps import results

    summary = results.read(emu.home.run_dir(sweep)) or {}
    best = summary.get("best_child_run_id")
    done = {t["name"] for t in summary.get("trials", []) if t.get("status") == "Completed"}
    return best if best in done else None


NO_BEST = "the sweep completed without a best trial (no completed trial logged the primary metric): its " \
          "dependents have no outputs to read"
