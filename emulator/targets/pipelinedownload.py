"""`amlemu job download` of a pipeline job, as `az ml job download` chooses for one:

- no option: the pipeline's own logs (its driver's `system_logs/driver.txt`) into <dest>/<pipeline>;
- `--output-name <o>`: the pipeline-level output `o` (written by the step output bound to it,
  `${{parent.outputs.o}}`) into <dest>/<pipeline>/named-outputs/<o>;
- `--all`: both, every pipeline-level output, and (amlemu's addition: az ml downloads each step
  with its own `job download -n <child job>`) each step's child job exactly as `job download -n
  <child job> --all -p <dest>` lays it out: <dest>/<child job>/ with its logs, outputs and
  named-outputs/<output>. A step that never ran, or whose files cannot be read, is a `skip` line.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from amlemu.actions import Action
from amlemu.errors import AmlEmuError, NotFoundError
from amlemu.pipelines import stepio
from amlemu.pipelines.pipelinespec import PipelineSpec
from amlemu.pipelines import submit as pipelines
from amlemu.runs.handle import Run

if TYPE_CHECKING:
    from amlemu.targets.local import EmulatorTarget

DEFAULT_OUTPUT = "default"  # az ml's name for a job's logs and default output


def output_uris(spec: PipelineSpec, steps: list[dict[str, Any]]) -> dict[str, str]:
    """Each pipeline-level output a step wrote: its datastore URI (where the bound step's job put it). Pure."""
    return {name: out["path"] for name, out in stepio.pipeline_outputs(spec, pipelines.output_sources(steps)).items()}


def written_outputs(emu: Any, run: Run, steps: list[dict[str, Any]]) -> dict[str, str]:
    """`job show`'s pipeline-level outputs: where each was written so far (none when the pipeline's
    components can no longer be read, say one was deleted from the registry)."""
    try:
        return output_uris(pipelines.from_record(emu, run.record.job), steps)
    except AmlEmuError:
        return {}


def missing_output(spec: PipelineSpec, pipeline: str, name: str) -> NotFoundError:
    """Why `--output-name <name>` has nothing to download. Pure."""
    if name in spec.bound_outputs():
        return NotFoundError("output", name, message=f"pipeline {pipeline}'s output {name} is not written: the step "
                             f"bound to it has not run (see `amlemu job show {pipeline}`)")
    if name in spec.outputs:
        return NotFoundError("output", name, message=f"pipeline {pipeline}'s output {name} is bound to no step's "
                             "output (jobs.<step>.outputs.<o>: ${{parent.outputs." + name + "}})")
    return NotFoundError("output", name, f"pipeline {pipeline} has: {', '.join([DEFAULT_OUTPUT, *spec.outputs])}; "
                         f"a step's own output: amlemu job download -n {pipeline}_<step> --output-name <output>")


def plan(target: EmulatorTarget, run: Run, dest: Path, output_name: str | None, everything: bool) -> list[Action]:
    outputs: dict[str, str] = {}
    if output_name not in (None, DEFAULT_OUTPUT) or everything:  # the spec is read (its component files) only then
        spec = pipelines.from_record(target.emu, run.record.job)
        outputs = output_uris(spec, (pipelines.read_steps(run.dir) or {}).get("steps", []))
        if output_name not in (None, DEFAULT_OUTPUT, *outputs):
            raise missing_output(spec, run.id, output_name)
    found: list[Action] = []
    if output_name in (None, DEFAULT_OUTPUT) or everything:
        found.append(target.run_files(run, dest))
    wanted = outputs if everything else {k: v for k, v in outputs.items() if k == output_name}
    for out, uri in wanted.items():
        found.append(target.named_output(out, uri, dest / run.id / "named-outputs" / out, required=not everything))
    if everything:
        found += _steps(target, run, dest)
    return found


def _steps(target: EmulatorTarget, run: Run, dest: Path) -> list[Action]:
    """Each step's child job, as `job download -n <child> --all -p <dest>` downloads it."""
    found: list[Action] = []
    for step in (pipelines.read_steps(run.dir) or {}).get("steps", []):
        child = step.get("child_job")
        if not child:
            found.append(Action("skip", "step", step["step"], {"why": f"{step['status']}: no child job"}))
            continue
        try:  # a reused step's files are the run it reused (az ml downloads that one too); a sweep's, its best trial's
            found += target.plan_download(step.get("reused_from") or child, dest, None, True)
        except AmlEmuError as exc:  # its files gone, a sweep step without a best trial: the rest still comes
            found.append(Action("skip", "step", step["step"], {"job": child, "why": str(exc)}))
    return found
