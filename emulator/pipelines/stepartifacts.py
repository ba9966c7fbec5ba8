"""A step's `artifacts` output: written without a path, Azure ML's name for the step's own run
artifacts (its ./outputs, logs/, user_logs/ ...: what `azureml://jobs/<job>/outputs/artifacts`
names), so that a dependent reads `${{inputs.x}}/outputs/<file>` (azureml-examples'
hello-pipeline-default-artifacts). amlemu keeps a run's artifacts in its run folder, not on a
datastore: when such a step completes, the driver copies them to the output's place (its default
path on the default datastore), where its dependents' inputs read them.

The run's files were written by the job: they are read as `amlemu job download` and the studio read
them (runs/runfiles.py): regular files only, no link followed, no private file.
"""
from __future__ import annotations

import posixpath
import shutil
from typing import TYPE_CHECKING

from amlemu.errors import AmlEmuError
from amlemu.pipelines.pipelinespec import PipelineSpec
from amlemu.pipelines.stepio import output_spec
from amlemu.runs.runfiles import open_in_run, walk_files
from amlemu.storage.datastores import parse_uri

if TYPE_CHECKING:
    from amlemu.api import Emulator

ARTIFACTS = "artifacts"


def artifacts_uri(spec: PipelineSpec, step_name: str, child_job: str) -> str | None:
    """Where the step's run artifacts go: its inline `artifacts` output written without a path
    (nor bound up to a pipeline output), at that output's place; else None (a component's own
    output of that name is the component's to write)."""
    step = spec.steps[step_name]
    out = step.outputs.get(ARTIFACTS)
    if step.type != "command" or step.component_ref is not None or out is None or out.path or out.parent:
        return None
    return str(output_spec(spec, step_name, ARTIFACTS, child_job)["path"])


def publish(emu: Emulator, spec: PipelineSpec, step_name: str, child_job: str) -> str | None:
    """Copy the completed step's run artifacts to its `artifacts` output, if it has one; returns
    why that failed (the step then fails: its dependents would read nothing), else None."""
    uri = artifacts_uri(spec, step_name, child_job)
    if uri is None:
        return None
    run_dir = emu.home.run_dir(child_job)
    try:
        datastore, path = parse_uri(uri)
        fs, root = emu.datastores.filesystem(datastore)
        with emu.datastores.guarded(datastore):
            for rel, _ in walk_files(run_dir):
                source = open_in_run(run_dir, rel)
                if source is None:  # swapped for a link or a special file since it was listed
                    continue
                target = posixpath.join(root, path, rel)
                fs.makedirs(posixpath.dirname(target), exist_ok=True)
                with source, fs.open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink)
    except AmlEmuError as exc:
        return f"outputs.{ARTIFACTS}: the run's artifacts could not be copied to {uri}: {exc}"
    return None
