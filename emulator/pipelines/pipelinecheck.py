"""A pipeline's bindings checked as az ml checks them, pure: each step input bound to a pipeline
input or another step's output that exists, with a type that fits; each output bound up to a
pipeline output that exists, once; no cycle. One line each, naming the step and field.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from amlemu.errors import ConfigError
from amlemu.pipelines import stepcomponent, sweepstep
from amlemu.pipelines.bindings import ParentInput, StepInput, StepOutputRef, Template, compatible
from amlemu.pipelines.graph import find_cycle

if TYPE_CHECKING:
    from amlemu.pipelines.pipelinespec import PipelineSpec, Step


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
        if step.type == "sweep":  # its search space, sampling, objective, limits, early termination
            sweepstep.check_step(step)
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
                                  f"'{out.parent}'", f"declare it under outputs: (the pipeline's outputs: "
                                  f"{', '.join(spec.outputs) or 'none'})")
            if out.parent in bound:
                raise ConfigError(where, f"the pipeline's output '{out.parent}' is already bound by "
                                  f"jobs.{bound[out.parent]}",
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
    parents = [binding.name] if isinstance(binding, ParentInput) else \
        list(binding.names) if isinstance(binding, Template) else []
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
