"""Planning a pipeline's run, pure: the steps' dependency graph (an edge for each input bound to
another step's output), their order, which steps may start now, what a failed step stops, and the
reuse key that says a step's earlier run can stand for this one. The runner asks; nothing here runs.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from amlemu.specs import RunStatus

if TYPE_CHECKING:
    from amlemu.pipelines.pipelinespec import PipelineSpec

States = Mapping[str, "RunStatus | str"]  # step -> its child job's status; a step not there has not started
# A component's fields that do not change what it runs: left out of the reuse key, as a renamed or
# re-described component does the same work. `code` is there as its content hash instead.
COSMETIC_FIELDS = ("$schema", "name", "version", "display_name", "description", "tags", "is_deterministic", "code")
REUSE_KEY_VERSION = 1


def find_cycle(deps: Mapping[str, Sequence[str]]) -> list[str] | None:
    """A cycle among the steps as [a, b, ..., a], following each step to the steps it reads; None if
    there is none. References to unknown steps are ignored (they are refused by name elsewhere)."""
    color: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        color[node] = 1
        path.append(node)
        for up in deps.get(node, ()):
            if up not in deps:
                continue
            if color.get(up) == 1:
                return path[path.index(up):] + [up]
            if up not in color and (found := visit(up)):
                return found
        path.pop()
        color[node] = 2
        return None

    for start in deps:
        if start not in color and (found := visit(start)):
            return list(reversed(found))  # written in data-flow order: producer -> consumer
    return None


def dependencies(spec: PipelineSpec) -> dict[str, tuple[str, ...]]:
    """Each step -> the steps whose outputs it reads."""
    return {name: step.upstream for name, step in spec.steps.items()}


def dependents(spec: PipelineSpec) -> dict[str, tuple[str, ...]]:
    """Each step -> the steps that read its outputs, in the YAML's order."""
    found: dict[str, list[str]] = {name: [] for name in spec.steps}
    for name, ups in dependencies(spec).items():
        for up in ups:
            found[up].append(name)
    return {name: tuple(names) for name, names in found.items()}


def topological_order(spec: PipelineSpec) -> list[str]:
    """Every step after the steps it reads; among steps free at once, the YAML's order (Kahn's)."""
    deps = dependencies(spec)
    done: set[str] = set()
    order: list[str] = []
    while len(order) < len(deps):
        free = [n for n in deps if n not in done and all(up in done for up in deps[n])]
        if not free:  # pipeline_from_dict refuses cycles; a spec built by hand may still have one
            raise ValueError(f"the steps form a cycle: {' -> '.join(find_cycle(deps) or [])}")
        order.extend(free)
        done.update(free)
    return order


def downstream(spec: PipelineSpec, step: str) -> list[str]:
    """The steps that read `step`'s outputs, directly or through others, in run order."""
    below, todo, deps_of = set(), [step], dependents(spec)
    while todo:
        for child in deps_of[todo.pop()]:
            if child not in below:
                below.add(child)
                todo.append(child)
    return [name for name in topological_order(spec) if name in below]


def _status(value: RunStatus | str | None) -> RunStatus | None:
    return None if value is None else RunStatus(value)


def _started(states: States, name: str) -> bool:
    return _status(states.get(name)) not in (None, RunStatus.NOT_STARTED)


def _running(states: States, name: str) -> bool:
    status = _status(states.get(name))
    return status not in (None, RunStatus.NOT_STARTED) and not status.is_terminal


def ready(spec: PipelineSpec, states: States) -> list[str]:
    """The steps that may start now: not started, every step they read Completed (a reused step is
    Completed), in run order. None once a step failed or was canceled, unless the pipeline's
    settings.continue_on_step_failure lets the steps that do not read it go on."""
    status = {name: _status(states.get(name)) for name in spec.steps}
    stopped = [n for n, s in status.items() if s in (RunStatus.FAILED, RunStatus.CANCELED)]
    if stopped and not spec.settings.continue_on_step_failure:
        return []
    deps = dependencies(spec)
    return [name for name in topological_order(spec)
            if not _started(states, name) and all(status[up] is RunStatus.COMPLETED for up in deps[name])]


@dataclass(frozen=True)
class FailurePlan:
    """What a failed step stops: steps that will never start, and running steps to cancel."""
    not_run: tuple[str, ...]
    cancel: tuple[str, ...]


def after_failure(spec: PipelineSpec, failed: str, states: States) -> FailurePlan:
    """With continue_on_step_failure, only the steps that read the failed step's outputs (directly
    or not) are stopped; without it (Azure ML's default), every step not finished: those not
    started never start, those running are canceled."""
    if spec.settings.continue_on_step_failure:
        return FailurePlan(tuple(n for n in downstream(spec, failed) if not _started(states, n)), ())
    order = [n for n in topological_order(spec) if n != failed]
    active = tuple(n for n in order if _running(states, n))
    return FailurePlan(tuple(n for n in order if not _started(states, n)), active)


def finished(spec: PipelineSpec, states: States) -> bool:
    """Nothing running and nothing more that may start."""
    return not any(_running(states, n) for n in spec.steps) and not ready(spec, states)


def pipeline_status(spec: PipelineSpec, states: States) -> RunStatus:
    """The pipeline job's own status from its steps': Running until finished, then Failed if a step
    failed, Canceled if one was canceled, Completed when every step completed."""
    if not finished(spec, states):
        return RunStatus.RUNNING
    shown = {_status(states.get(n)) for n in spec.steps}
    if RunStatus.FAILED in shown or RunStatus.NOT_RESPONDING in shown:
        return RunStatus.FAILED
    if shown == {RunStatus.COMPLETED}:
        return RunStatus.COMPLETED
    return RunStatus.CANCELED


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def reuse_key(component: Mapping[str, Any], *, code_hash: str | None, environment: Any,
              input_hashes: Mapping[str, str], parameters: Mapping[str, Any],
              run_fields: Mapping[str, Any] | None = None, is_deterministic: bool = True,
              force_rerun: bool = False) -> str | None:
    """The key under which a step's successful run can be reused: a hash of what decides its work,
    its component's content (cosmetic fields left out), its code's content hash, its environment,
    each data input's content hash, its parameters (literal inputs, after binding) and the step's
    own fields that change the run (`run_fields`: command, distribution, environment_variables...).
    None when reuse is off: the component is `is_deterministic: false`, or the pipeline's
    settings.force_rerun is true. Compute is not in it: the same work on another cluster is reused."""
    if force_rerun or not is_deterministic:
        return None
    body = {
        "version": REUSE_KEY_VERSION,
        "component": {k: v for k, v in component.items() if k not in COSMETIC_FIELDS},
        "code": code_hash,
        "environment": environment,
        "inputs": dict(input_hashes),
        "parameters": dict(parameters),
        "run": dict(run_fields or {}),
    }
    return hashlib.sha256(_canonical(body).encode()).hexdigest()
