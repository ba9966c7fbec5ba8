"""Step reuse, as Azure ML does it: a deterministic step whose work is the same as an earlier
successful run's (its component, code, environment, inputs' content, parameters, output settings)
is not run again; its child job is recorded Completed with `azureml.isreused: "true"` and
`azureml.reusedrunid: <the run reused>`, and its dependents read that run's outputs.

What goes into a step's key (graph.reuse_key through stepio.step_reuse_key, with what only the
runner can read folded in here):
- the code folder's content as the snapshot takes it (emulator/jobs/snapshot.py: .amlignore
  applied), each file's path, executable bit and bytes; `code: git+...` is never reused (its
  content is only known once cloned);
- each data input's content: a local file or folder, an `azureml://datastores/...` path read through
  the workspace's datastores (a blob's ETag where the store gives one, else its bytes), a data asset
  through what it resolves to; a URL by itself (it is not fetched to be hashed). An input bound to an
  upstream step's output stands for that step's key and the output's name (the upstream's run when
  it has no key): changing a file re-runs the step that reads it and, through the keys, its dependents
  only;
- the environment as the job resolves it (an inline one's definition) and the outputs' settings
  (type, mode, path with `${{name}}` left in).
A key is recorded on the child run that ran (runs.reuse_key); a reused child carries none, so every
reuse names the run that did the work. A run whose outputs were since deleted is not reused.
"""
from __future__ import annotations

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from amlemu.errors import AmlEmuError
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.snapshot import plan_snapshot
from amlemu.pipelines import stepio
from amlemu.pipelines.bindings import StepOutputRef
from amlemu.pipelines.submit import child_name, step_job
from amlemu.specs import RunStatus
from amlemu.storage.assets import default_output_uri, is_asset_ref
from amlemu.storage.datastores import parse_uri

if TYPE_CHECKING:
    from amlemu.api import Emulator
    from amlemu.cluster.records import RunRecord
    from amlemu.pipelines.pipelinespec import PipelineSpec

# azure-ai-ml's names (azure/ai/ml/constants/_job/pipeline.py: REUSED_FLAG_FIELD, REUSED_JOB_ID) and
# the pipeline the reused run belonged to, as the v1 run properties have it.
REUSED_FLAG = "azureml.isreused"
REUSED_RUN = "azureml.reusedrunid"
REUSED_PIPELINE = "azureml.reusedpipelinerunid"
NAME_MACRO = "${{name}}"  # an output's path with the child job's name left in: the same for every run


@dataclass(frozen=True)
class StepKey:
    key: str | None  # None: the step is not reused (and its run is recorded without a key)
    why: str = ""  # why there is no key


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _file_sha(open_file: Any) -> str:
    digest = hashlib.sha256()
    with open_file() as reader:
        for chunk in iter(lambda: reader.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def code_hash(code: Path | None) -> str:
    """The snapshot's content: each file it would hold, by its path in it, executable bit and bytes."""
    plan = plan_snapshot(code)
    if plan.outside or plan.refused:  # the submit refuses it, in one line: no key needed
        raise (plan.outside + plan.refused)[0]
    lines = [f"{rel}:{int(os.access(path, os.X_OK))}:{_file_sha(lambda p=path: open(p, 'rb'))}"
             for rel, path in sorted(plan.files.items())]
    return _digest("code", *lines)


def local_hash(path: Path) -> str:
    """A local file (its name and bytes) or folder (each file's relative path and bytes)."""
    if path.is_file():
        return _digest("file", path.name, _file_sha(lambda: open(path, "rb")))
    if not path.is_dir():
        return _digest("missing", str(path))  # the submit names it; a later run with it there differs
    files = sorted(p for p in path.rglob("*") if p.is_file())
    return _digest("folder", *(f"{p.relative_to(path).as_posix()}:{_file_sha(lambda p=p: open(p, 'rb'))}"
                               for p in files))


def datastore_hash(emu: Emulator, uri: str) -> str:
    """What is at a datastore URI: each file's path under it and its ETag (a blob store's, which
    changes whenever the blob is written) or, where the store gives none (a local folder), its bytes."""
    name, path = parse_uri(uri)
    fs, root = emu.datastores.filesystem(name)
    base = posixpath.join(root, path)
    with emu.datastores.guarded(name):
        if fs.isfile(base):
            found = {base: fs.info(base)}
        else:
            found = fs.find(base, detail=True) if fs.exists(base) else {}
        lines = []
        for remote, info in sorted(found.items()):
            tag = info.get("etag") or _file_sha(lambda r=remote: fs.open(r, "rb"))
            lines.append(f"{posixpath.relpath(remote, base)}:{info.get('size')}:{tag}")
    return _digest("datastore", name, *lines)


def input_hash(emu: Emulator, value: Mapping[str, Any], field: str) -> str:
    """A data input's settings (type, mode) and content, wherever its path points."""
    settings = {k: v for k, v in value.items() if k != "path"}
    path = str(value.get("path", ""))
    if is_asset_ref(path) or path.startswith("azureml://jobs/"):
        path = emu.assets.resolve(path, field)[1]
    if path.startswith("azureml://datastores/"):
        content = datastore_hash(emu, path)
    elif "://" in path:
        content = _digest("url", path)  # not fetched: a change behind the same URL is not seen
    else:
        content = local_hash(Path(path))
    return _digest(_canonical(settings), content)


def upstream_hash(value: Mapping[str, Any], ref: StepOutputRef, keys: Mapping[str, str | None],
                  sources: Mapping[str, str]) -> str:
    """An input bound to another step's output: that step's key (or, without one, the run whose
    outputs it is) and the output's name, with the input's own settings."""
    settings = {k: v for k, v in value.items() if k != "path"}
    upstream = keys.get(ref.step)
    stands_for = f"key:{upstream}" if upstream else f"run:{sources[ref.step]}"
    return _digest("upstream", stands_for, ref.output, _canonical(settings))


def step_key(emu: Emulator, spec: PipelineSpec, step: str, pipeline: str, sources: Mapping[str, str],
             keys: Mapping[str, str | None]) -> StepKey:
    """The step's reuse key, its inputs bound to `sources` (step -> the run whose outputs stand for
    it) and upstream steps' `keys`; StepKey(None, why) when it is not to be reused."""
    item = spec.steps[step]
    if item.type != "command":
        return StepKey(None, f"a {item.type} step is not reused")
    try:
        job = step_job(spec, step, pipeline, sources)
        if job.code_git:
            return StepKey(None, "its code is a git repository (its content is known only once cloned)")
        params, data = stepio.split_inputs(stepio.bind_inputs(spec, step, sources))
        hashes = {}
        for name, value in data.items():
            binding = item.inputs[name].binding if name in item.inputs else None
            hashes[name] = (upstream_hash(value, binding, keys, sources) if isinstance(binding, StepOutputRef)
                            else input_hash(emu, value, f"jobs.{step}.inputs.{name}"))
        key = stepio.step_reuse_key(spec, step, code_hash=code_hash(job.code), input_hashes=hashes,
                                    parameters=params)
    except (AmlEmuError, OSError) as exc:  # the submit that follows says it in its own words
        return StepKey(None, f"its key could not be read: {exc}")
    if key is None:
        return StepKey(None, "settings.force_rerun is true" if spec.settings.force_rerun
                       else "its component is not deterministic (is_deterministic: false)")
    resolved = {"environment": job.environment, "environment_def": job.environment_def,
                "outputs": stepio.step_outputs(spec, step, NAME_MACRO)}
    return StepKey(_digest(key, _canonical(resolved)))


def outputs_exist(emu: Emulator, record: RunRecord) -> bool:
    """Every named output of the run still has something where the run wrote it."""
    for name, out in (record.job.get("outputs") or {}).items():
        path = str(out.get("path") or default_output_uri(record.id, name))
        try:
            if path.startswith("azureml://datastores/"):
                store, rel = parse_uri(path)
                fs, root = emu.datastores.filesystem(store)
                with emu.datastores.guarded(store):
                    base = posixpath.join(root, rel)
                    if not (fs.isfile(base) or (fs.exists(base) and fs.find(base))):
                        return False
            elif not Path(path).exists():
                return False
        except (AmlEmuError, OSError):
            return False
    return True


def find_reusable(emu: Emulator, key: str) -> RunRecord | None:
    """The newest Completed run recorded under `key` whose outputs are all still there."""
    return next((r for r in emu.store.runs_with_reuse_key(key) if outputs_exist(emu, r)), None)


def reuse_properties(original: RunRecord) -> dict[str, str]:
    return {REUSED_FLAG: "true", REUSED_RUN: original.id, REUSED_PIPELINE: original.parent or ""}


def record_reused(emu: Emulator, spec: PipelineSpec, step: str, pipeline: str, sources: Mapping[str, str],
                  original: RunRecord) -> str:
    """The step's child job `<pipeline>_<step>`, Completed at once with the reuse properties: nothing
    runs (no supervisor, no node); its outputs are the reused run's, and its log says so."""
    child, job = child_name(pipeline, step), step_job(spec, step, pipeline, sources)
    record = {**job_to_record(job), "outputs": dict(original.job.get("outputs") or {}),
              "properties": reuse_properties(original)}
    logs = emu.home.run_dir(child) / "user_logs"
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "std_log.txt").write_text(f"Step {step} was not run: it reused run {original.id} (of pipeline "
                                      f"{original.parent or '-'}), whose outputs it shows.\n")
    emu.store.add_run(child, job.experiment_name, original.cluster, record, parent=pipeline)
    with emu.store.transaction() as db:  # one step for readers: NotStarted, then Completed
        for status in (RunStatus.QUEUED, RunStatus.PREPARING, RunStatus.RUNNING, RunStatus.FINALIZING):
            emu.store.set_status(child, status, f"reusing {original.id}" if status is RunStatus.QUEUED else "", db=db)
        emu.store.set_status(child, RunStatus.COMPLETED, f"reused {original.id}: not run", db=db)
    return child
