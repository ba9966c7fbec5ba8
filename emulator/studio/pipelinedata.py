"""A pipeline job as the studio draws it, pure: its steps (each one's child job, status, why it did
not run, the run it reused), the data edges (a step's output -> the input of a step that reads it)
and the layers the page lays the steps out in, left to right (a step one layer right of the deepest
step it reads). From the pipeline's record (the YAML it was submitted with, `record["pipeline"]`),
the pipeline.json its driver rewrites as steps move (pipelines/submit.py read_steps), and its child
jobs' records, which are fresher than pipeline.json on a status (as a sweep's trials are).

The edges are the ones graph.dependencies follows: each step input that bindings.parse_input reads
as `${{parent.jobs.<step>.outputs.<output>}}`. They are read from the YAML as it was kept, not from
a reloaded PipelineSpec: the page needs neither the component files (they may have changed since)
nor the registry. A step name, output or input name is user data: the page escapes it.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from amlemu.cluster.records import RunRecord
from amlemu.errors import ConfigError
from amlemu.pipelines.bindings import StepOutputRef, parse_input

NOT_STARTED = "NotStarted"


def is_pipeline(record: RunRecord) -> bool:
    return record.job.get("kind") == "pipeline"


def _jobs(yaml: Any) -> dict[str, Any]:
    """The pipeline's steps as written (its `jobs`), in the YAML's order; {} if the record has none."""
    jobs = yaml.get("jobs") if isinstance(yaml, Mapping) else None
    return {str(k): v for k, v in jobs.items()} if isinstance(jobs, Mapping) else {}


def edges(yaml: Any) -> list[dict[str, str]]:
    """Each binding of a step's input to another step's output, in the YAML's order:
    {"from": step, "output": its output, "to": the step reading it, "input": that step's input}."""
    jobs = _jobs(yaml)
    found = []
    for name, raw in jobs.items():
        inputs = raw.get("inputs") if isinstance(raw, Mapping) else None
        for key, value in (inputs.items() if isinstance(inputs, Mapping) else ()):
            try:
                binding = parse_input(value, f"jobs.{name}.inputs.{key}").binding
            except ConfigError:  # refused at submit; a record written by hand may still hold one
                continue
            if isinstance(binding, StepOutputRef) and binding.step in jobs and binding.step != name:
                found.append({"from": binding.step, "output": binding.output, "to": name, "input": str(key)})
    return found


def layers(steps: Sequence[str], links: Sequence[Mapping[str, str]]) -> list[list[str]]:
    """The steps in columns, left to right: a step that reads no other in the first, every other one
    column right of the deepest step it reads. In a column, steps sit in the order of the mean row of
    the steps they read (fewer crossing edges), ties in the YAML's order. A cycle (refused at submit)
    cannot hide a step: what is left once no step is free goes in a last column."""
    deps: dict[str, set[str]] = {s: set() for s in steps}
    for link in links:
        if link["to"] in deps and link["from"] in deps:
            deps[link["to"]].add(link["from"])
    depth: dict[str, int] = {}
    while len(depth) < len(steps):
        free = [s for s in steps if s not in depth and deps[s] <= set(depth)]
        if not free:
            last = max(depth.values(), default=-1) + 1
            depth.update({s: last for s in steps if s not in depth})
            break
        depth.update({s: max((depth[up] + 1 for up in deps[s]), default=0) for s in free})
    columns: list[list[str]] = []
    row: dict[str, int] = {}
    for number in range(max(depth.values(), default=-1) + 1):
        columns.append(_ordered([s for s in steps if depth[s] == number], deps, row))
        row.update({s: i for i, s in enumerate(columns[-1])})
    return columns


def _ordered(members: list[str], deps: Mapping[str, set[str]], row: Mapping[str, int]) -> list[str]:
    """A column's steps by the mean row of the steps they read (in the columns left of it), ties and
    steps reading none in the YAML's order."""
    def place(index: int) -> tuple[float, int]:
        rows = [row[up] for up in deps[members[index]] if up in row]
        return (sum(rows) / len(rows) if rows else float(index), index)
    return [members[i] for i in sorted(range(len(members)), key=place)]


def _node(name: str, raw: Any, entry: Mapping[str, Any], statuses: Mapping[str, str], pipeline: str,
          ended: bool) -> dict[str, Any]:
    """One step's box: its child job (pipeline.json's, else `<pipeline>_<step>` once the store has
    it: the driver submits a step before it rewrites pipeline.json), status from the child's record."""
    child = entry.get("child_job") or (f"{pipeline}_{name}" if f"{pipeline}_{name}" in statuses else None)
    status = statuses.get(child) if child else None
    status = str(status or entry.get("status") or NOT_STARTED)
    detail = str(entry.get("detail") or "")
    reused = entry.get("reused_from")
    return {"step": name, "type": str(raw.get("type", "command")) if isinstance(raw, Mapping) else "command",
            "child_job": str(child) if child else None, "status": status, "detail": detail,
            "reused_from": str(reused) if reused else None,
            "not_run": status == NOT_STARTED and (ended or detail.startswith("not run"))}


def pipeline_view(record: RunRecord, shown: Mapping[str, Any] | None, children: Sequence[RunRecord]) -> dict[str, Any]:
    """The pipeline page's data (without what every job has: the caller adds status, events, files):
    `steps` in the YAML's order, `edges`, `layers`, and how many steps are in each status."""
    kept = record.job.get("pipeline")
    yaml = kept.get("yaml") if isinstance(kept, Mapping) else None
    jobs = _jobs(yaml)
    listed = shown.get("steps") if isinstance(shown, Mapping) else None
    entries = {str(e["step"]): e for e in listed or () if isinstance(e, Mapping) and "step" in e}
    names = list(jobs) + [n for n in entries if n not in jobs]  # a step only pipeline.json names: shown too
    statuses = {c.id: c.status.value for c in children}
    steps = [_node(n, jobs.get(n), entries.get(n, {}), statuses, record.id, record.status.is_terminal) for n in names]
    links = edges(yaml)
    counts: dict[str, int] = {}
    for step in steps:
        counts[step["status"]] = counts.get(step["status"], 0) + 1
    settings = yaml.get("settings") if isinstance(yaml, Mapping) else None
    keep_going = shown.get("continue_on_step_failure") if isinstance(shown, Mapping) else None
    if keep_going is None and isinstance(settings, Mapping):
        keep_going = settings.get("continue_on_step_failure")
    return {"steps": steps, "edges": links, "layers": layers(names, links), "counts": counts,
            "continue_on_step_failure": bool(keep_going)}
