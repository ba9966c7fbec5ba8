"""Pipeline step reuse (emulator/pipelines/reuse.py, driver.py): the content hashes that go into a
step's key, the lookup of an earlier successful run (not one whose outputs were deleted), and on
process nodes: a second run of the same pipeline reuses every step without running anything, a
changed input file re-runs the step that reads it and its dependents only, and force_rerun or a
non-deterministic component re-runs."""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import STARTUP

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.pipelines import reuse
from amlemu.pipelines import submit as pipelines
from amlemu.pipelines.pipelinespec import load_pipeline
from amlemu.specs import RunStatus
from amlemu.storage.datastores import DatastoreSpec

STEP = """
import pathlib, sys
what, args = sys.argv[1], sys.argv[2:]
if what == "prepare":
    pathlib.Path(args[1], "data.txt").write_text(pathlib.Path(args[0], "raw.txt").read_text().strip() + " prepared")
elif what == "train":
    text = pathlib.Path(args[0], "data.txt").read_text() + ", " + pathlib.Path(args[1]).read_text().strip()
    pathlib.Path(args[2], "model.txt").write_text(text + " trained")
elif what == "eval":
    print("eval read:", pathlib.Path(args[0], "model.txt").read_text(), "|", pathlib.Path(args[1]).read_text().strip(),
          flush=True)
"""
ENV = "azureml:AzureML-sklearn-1.5@latest"
TRAIN = f"""
type: command
name: train
code: src
environment: {ENV}
command: python step.py train ${{{{inputs.data}}}} ${{{{inputs.cfg}}}} ${{{{outputs.model}}}}
inputs: {{data: {{type: uri_folder}}, cfg: {{type: uri_file}}}}
outputs: {{model: {{type: uri_folder}}}}
"""
PIPELINE = f"""
type: pipeline
experiment_name: reuse
settings: {{default_compute: azureml:c1}}
inputs:
  raw: {{type: uri_folder, path: ./raw}}
  cfg: {{type: uri_file, path: ./cfg.txt}}
  note: {{type: uri_file, path: ./note.txt}}
jobs:
  prepare:
    type: command
    code: src
    environment: {ENV}
    command: python step.py prepare ${{{{inputs.raw}}}} ${{{{outputs.data}}}}
    inputs: {{raw: '${{{{parent.inputs.raw}}}}'}}
    outputs: {{data: {{type: uri_folder}}}}
  train:
    component: ./train.yml
    inputs: {{data: '${{{{parent.jobs.prepare.outputs.data}}}}', cfg: '${{{{parent.inputs.cfg}}}}'}}
  eval:
    type: command
    code: src
    environment: {ENV}
    command: python step.py eval ${{{{inputs.model}}}} ${{{{inputs.note}}}}
    inputs: {{model: '${{{{parent.jobs.train.outputs.model}}}}', note: '${{{{parent.inputs.note}}}}'}}
"""
STEPS = ("prepare", "train", "eval")


def write_pipeline(root: Path, raw: str = "R", cfg: str = "C1", note: str = "N1") -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "step.py").write_text(STEP)
    (root / "raw").mkdir()
    (root / "raw" / "raw.txt").write_text(raw)
    (root / "cfg.txt").write_text(cfg)
    (root / "note.txt").write_text(note)
    (root / "train.yml").write_text(TRAIN)
    (root / "pipeline.yml").write_text(PIPELINE)
    return root / "pipeline.yml"


# --- the hashes and the lookup ---------------------------------------------------------------------

def test_code_and_local_hashes_follow_content_not_place(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for folder in (one, two):
        (folder / "sub").mkdir(parents=True)
        (folder / "a.py").write_text("print(1)")
        (folder / "sub" / "b.txt").write_text("b")
    assert reuse.code_hash(one) == reuse.code_hash(two) and reuse.local_hash(one) == reuse.local_hash(two)
    (two / ".amlignore").write_text("sub/\n")  # what the snapshot leaves out is not in the key
    ignoring = reuse.code_hash(two)
    (two / "sub" / "b.txt").write_text("changed")
    assert reuse.code_hash(two) == ignoring and reuse.local_hash(two) != reuse.local_hash(one)
    (two / "a.py").chmod(0o755)  # the snapshot keeps the executable bit
    assert reuse.code_hash(two) != ignoring
    (tmp_path / "f.txt").write_text("x")
    (tmp_path / "g.txt").write_text("x")
    assert reuse.local_hash(tmp_path / "f.txt") != reuse.local_hash(tmp_path / "g.txt")  # a file's name counts
    assert reuse.local_hash(tmp_path / "gone") != reuse.local_hash(tmp_path / "f.txt")


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_steps_key_changes_with_its_inputs_content_and_upstream_and_is_off_when_it_must_be(
        emu: Emulator, tmp_path: Path) -> None:
    spec = load_pipeline(write_pipeline(tmp_path / "p"), components=None)
    copy = load_pipeline(write_pipeline(tmp_path / "q"), components=None)  # the same content elsewhere
    sources, keys = {"prepare": "p_prepare"}, {"prepare": "k1"}
    key = reuse.step_key(emu, spec, "train", "p", sources, keys).key
    assert key and reuse.step_key(emu, copy, "train", "other", {"prepare": "q_prepare"}, keys).key == key
    assert reuse.step_key(emu, spec, "train", "p", sources, {"prepare": "k2"}).key != key  # upstream re-ran
    unkeyed = reuse.step_key(emu, spec, "train", "p", sources, {"prepare": None}).key  # an upstream without a key:
    assert unkeyed != key and reuse.step_key(emu, spec, "train", "p", {"prepare": "p2_prepare"},  # its run stands
                                             {"prepare": None}).key != unkeyed
    (tmp_path / "p" / "cfg.txt").write_text("C2")
    assert reuse.step_key(emu, spec, "train", "p", sources, keys).key != key
    (tmp_path / "p" / "cfg.txt").write_text("C1")
    (tmp_path / "p" / "src" / "step.py").write_text(STEP + "\n# changed\n")
    assert reuse.step_key(emu, spec, "train", "p", sources, keys).key != key
    moved = load_pipeline(tmp_path / "q" / "pipeline.yml", ["jobs.train.outputs.model.mode=upload"], components=None)
    assert reuse.step_key(emu, moved, "train", "q", sources, keys).key != key  # output settings count
    forced = load_pipeline(tmp_path / "q" / "pipeline.yml", ["settings.force_rerun=true"], components=None)
    assert reuse.step_key(emu, forced, "train", "q", sources, keys) == reuse.StepKey(None, "settings.force_rerun is true")
    (tmp_path / "q" / "train.yml").write_text(TRAIN + "is_deterministic: false\n")
    found = reuse.step_key(emu, load_pipeline(tmp_path / "q" / "pipeline.yml", components=None), "train", "q",
                           sources, keys)
    assert found.key is None and "is_deterministic: false" in found.why
    git = load_pipeline(tmp_path / "q" / "pipeline.yml", ["jobs.eval.code=git+https://example.invalid/r.git"],
                        components=None)
    assert reuse.step_key(emu, git, "eval", "q", {"train": "t"}, {"train": "k"}).key is None


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_datastore_inputs_content_is_read_and_a_run_whose_outputs_were_deleted_is_not_reused(
        emu: Emulator, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    (lake / "in").mkdir(parents=True)
    (lake / "in" / "x.csv").write_text("1")
    emu.datastores.create(DatastoreSpec("lake", "local", folder=str(lake)))
    value = {"type": "uri_folder", "path": "azureml://datastores/lake/paths/in"}
    first = reuse.input_hash(emu, value, "inputs.x")
    assert reuse.input_hash(emu, {**value, "path": str(lake / "in")}, "inputs.x") != first  # not the same store
    (lake / "in" / "x.csv").write_text("2")
    assert reuse.input_hash(emu, value, "inputs.x") != first
    assert reuse.input_hash(emu, {**value, "mode": "download"}, "inputs.x") != reuse.input_hash(emu, value, "inputs.x")

    out = {"model": {"type": "uri_folder", "path": "azureml://datastores/lake/paths/azureml/old_train/model/"}}
    for name in ("old_train", "newer_train"):
        emu.store.add_run(name, "reuse", "c1", {"outputs": out, "command": "x"}, parent="old")
        emu.store.update_run(name, status=RunStatus.COMPLETED.value, reuse_key="k")
    emu.store.update_run("newer_train", status=RunStatus.FAILED.value)  # only a successful run is reused
    assert reuse.find_reusable(emu, "k") is None  # its output holds nothing
    (lake / "azureml" / "old_train" / "model").mkdir(parents=True)
    (lake / "azureml" / "old_train" / "model" / "m.txt").write_text("m")
    found = reuse.find_reusable(emu, "k")
    assert found is not None and found.id == "old_train" and reuse.find_reusable(emu, "other") is None
    assert reuse.reuse_properties(found) == {"azureml.isreused": "true", "azureml.reusedrunid": "old_train",
                                             "azureml.reusedpipelinerunid": "old"}
    shutil.rmtree(lake / "azureml" / "old_train")
    assert reuse.find_reusable(emu, "k") is None


# --- end to end on process nodes ---------------------------------------------------------------------

def steps_of(emu: Emulator, run) -> dict[str, object]:  # type: ignore[no-untyped-def]
    return {s: emu.store.run(pipelines.child_name(run.id, s)) for s in STEPS}


def reused_from(emu: Emulator, run) -> dict[str, str | None]:  # type: ignore[no-untyped-def]
    """Each step -> the run it reused (None: it ran), as its child job's properties say."""
    return {s: (r.job.get("properties") or {}).get("azureml.reusedrunid") for s, r in steps_of(emu, run).items()}


def eval_read(emu: Emulator, run) -> str:  # type: ignore[no-untyped-def]
    return emu.run(pipelines.child_name(run.id, "eval")).logs().strip()


def first_run(emu: Emulator, cluster, root: Path):  # type: ignore[no-untyped-def]
    """The pipeline's first run, every step run (on nodes kept warm between steps: faster), and its steps' child jobs."""
    cluster(max_nodes=4, idle_seconds_before_scaledown=120)
    path = write_pipeline(root)
    first = emu.submit(path)
    assert first.wait(timeout=STARTUP) is RunStatus.COMPLETED, first.record.error
    assert reused_from(emu, first) == dict.fromkeys(STEPS) and eval_read(emu, first) == "eval read: R prepared, C1 trained | N1"
    return path, first, {s: pipelines.child_name(first.id, s) for s in STEPS}


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_a_second_run_reuses_every_step_and_a_changed_file_reruns_that_step_and_its_dependents_only(
        emu: Emulator, cluster, tmp_path: Path) -> None:
    path, first, ran = first_run(emu, cluster, tmp_path / "p")
    written = {"type": "uri_folder", "path": emu.store.run(ran["prepare"]).job["outputs"]["data"]["path"]}
    held = reuse.input_hash(emu, written, "x")  # a blob datastore's files (Azurite's), by their ETags
    assert held == reuse.input_hash(emu, written, "x") != reuse.input_hash(emu, {**written, "path": written["path"] + "none/"}, "x")
    again = emu.submit(path)
    assert again.wait(timeout=STARTUP) is RunStatus.COMPLETED, again.record.error
    assert reused_from(emu, again) == ran  # each step names the run that did the work
    for step, record in steps_of(emu, again).items():
        assert record.status is RunStatus.COMPLETED and record.nodes == [] and record.supervisor_pid is None
        assert record.job["properties"]["azureml.isreused"] == "true" and record.reuse_key is None
    assert "reused run " + ran["eval"] in eval_read(emu, again)  # its log says what it reused
    assert [s["reused_from"] for s in pipelines.read_steps(again.dir)["steps"]] == list(ran.values())  # type: ignore[index]
    env = {"AMLEMU_HOME": str(emu.home.root)}
    shown = CliRunner().invoke(cli, ["job", "show", again.id], env=env)
    assert f"{again.id}_train" in shown.output and f"Completed  reused {ran['train']}" in shown.output, shown.output
    human = CliRunner().invoke(cli, ["job", "show", f"{again.id}_eval"], env=env)
    assert f"reused: {ran['eval']} (azureml.isreused: true; not run)" in human.output, human.output
    child = CliRunner().invoke(cli, ["job", "show", f"{again.id}_eval", "-o", "json"], env=env)
    assert json.loads(child.output)["properties"] == {"azureml.isreused": "true", "azureml.reusedrunid": ran["eval"],
                                                      "azureml.reusedpipelinerunid": first.id}

    # At once: a copy with cfg.txt changed (train reads it, eval reads train), and note.txt changed
    # in place (only eval reads it).
    changed_cfg = emu.submit(write_pipeline(tmp_path / "cfg", cfg="C2"))
    (tmp_path / "p" / "note.txt").write_text("N2")
    note = emu.submit(path)
    for run in (note, changed_cfg):
        assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    assert reused_from(emu, note) == {**ran, "eval": None}
    assert eval_read(emu, note) == "eval read: R prepared, C1 trained | N2"  # it read the reused run's model
    assert reused_from(emu, changed_cfg) == {"prepare": ran["prepare"], "train": None, "eval": None}
    assert eval_read(emu, changed_cfg) == "eval read: R prepared, C2 trained | N1"


@pytest.mark.full  # each is a key unit-tested above (None); make test-full runs them on nodes
@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_force_rerun_and_a_non_deterministic_component_rerun(emu: Emulator, cluster, tmp_path: Path) -> None:
    _, _, ran = first_run(emu, cluster, tmp_path / "p")
    forced_path, loose_path = (Path(shutil.copytree(tmp_path / "p", tmp_path / n)) for n in ("forced", "loose"))
    (loose_path / "train.yml").write_text(TRAIN + "is_deterministic: false\n")
    forced = emu.submit(forced_path / "pipeline.yml", ["settings.force_rerun=true"])
    loose = emu.submit(loose_path / "pipeline.yml")
    for run in (forced, loose):
        assert run.wait(timeout=STARTUP) is RunStatus.COMPLETED, run.record.error
    assert reused_from(emu, forced) == dict.fromkeys(STEPS)
    assert all(r.reuse_key is None for r in steps_of(emu, forced).values())  # a forced run is never reused either
    assert reused_from(emu, loose) == {"prepare": ran["prepare"], "train": None, "eval": None}  # eval reads train
