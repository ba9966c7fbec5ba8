"""Pipeline jobs read and planned (emulator/pipelines/pipelinespec.py, graph.py, stepio.py), pure:
each shape of `type: pipeline` YAML az ml reads, each refusal as one line naming the step and field,
the graph (what may start, what a failure stops), the reuse key and the child job each step runs.
Every YAML here is the project's own."""
from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from amlemu.errors import ConfigError, NotFoundError
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.pipelines import graph, stepio
from amlemu.pipelines.bindings import Literal, ParentInput, StepOutputRef, Template, compatible
from amlemu.pipelines.pipelinespec import is_pipeline_file, load_pipeline, pipeline_from_dict
from amlemu.specs import RunStatus

# A command component with two data outputs of different types, and an optional input.
TRAIN = """
name: fit
version: "3"
type: command
inputs:
  data: {type: uri_folder}
  rate: {type: number, default: 0.1}
  tag: {type: string, optional: true}
outputs:
  model: {type: mlflow_model}
  table: {type: mltable}
environment: azureml:trainenv@latest
command: echo ${{inputs.data}} ${{inputs.rate}} $[[--tag ${{inputs.tag}}]] ${{outputs.model}} ${{outputs.table}}
"""
# Reads a folder.
READER = {"type": "command", "inputs": {"folder": {"type": "uri_folder"}}, "environment": "azureml:e:1",
          "command": "ls ${{inputs.folder}}"}


def load(tmp_path: Path, text: str, overrides: list[str] | None = None, **kwargs: Any):
    path = tmp_path / "pipeline.yml"
    path.write_text(textwrap.dedent(text))
    return load_pipeline(path, overrides, **kwargs)


def refused(tmp_path: Path, text: str, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "train.yml").write_text(TRAIN)
    (tmp_path / "data").mkdir()
    return tmp_path


INLINE = """
type: pipeline
display_name: three steps
experiment_name: pipes
compute: azureml:cpu
settings:
  default_datastore: azureml:lake
  continue_on_step_failure: true
inputs:
  count: 3
  raw: {type: uri_folder, path: ./data}
outputs:
  report: {mode: upload}
jobs:
  make:
    command: echo ${{inputs.n}} > ${{outputs.out}}/n.txt
    environment: {image: python:3.11-slim}
    inputs: {n: "${{parent.inputs.count}}", src: "${{parent.inputs.raw}}"}
    outputs: {out: }
  check:
    command: cat ${{inputs.got}}/n.txt
    environment: azureml:e:1
    compute: azureml:gpu
    inputs:
      got: {path: "${{parent.jobs.make.outputs.out}}", mode: download}
      label: "n=${{parent.inputs.count}}"
    outputs:
      result: "${{parent.outputs.report}}"
  old:
    command: cat ${{inputs.got}}/n.txt
    environment: azureml:other@latest
    inputs: {got: "${{jobs.make.outputs.out}}"}
"""


def test_inline_command_steps_their_bindings_and_settings(files: Path) -> None:
    spec = load(files, INLINE)
    assert list(spec.steps) == ["make", "check", "old"]
    assert (spec.display_name, spec.experiment_name, spec.compute) == ("three steps", "pipes", "cpu")
    s = spec.settings
    assert (s.default_datastore, s.continue_on_step_failure, s.force_rerun) == ("lake", True, False)
    make, check, old = spec.steps.values()
    assert make.inputs["n"].binding == ParentInput("count") and make.outputs["out"].parent is None
    assert make.job["environment"] == {"image": "python:3.11-slim"}
    assert old.job["environment"] == "azureml:other@latest"
    assert check.inputs["got"].binding == StepOutputRef("make", "out") and check.inputs["got"].mode == "download"
    assert check.inputs["label"].binding == Template("n=${{parent.inputs.count}}", ("count",))
    assert old.inputs["got"].binding == StepOutputRef("make", "out")  # the spelling without parent.
    assert check.outputs["result"].parent == "report" and spec.bound_outputs() == {"report": ("check", "result")}
    assert (make.compute, check.compute) == ("cpu", "gpu")
    assert check.upstream == ("make",) and make.upstream == ()
    assert is_pipeline_file(files / "pipeline.yml")
    assert pipeline_from_dict(spec.source, base_dir=files) == spec  # the record reloads as the same pipeline


def test_overrides_and_default_compute(files: Path) -> None:
    text = INLINE.replace("compute: azureml:cpu\n", "")
    spec = load(files, text, ["settings.default_compute=serverless", "jobs.make.compute=azureml:small"])
    assert (spec.steps["make"].compute, spec.steps["old"].compute) == ("small", "serverless")


def test_components_from_a_file_inline_and_registered(files: Path) -> None:
    text = """
    type: pipeline
    settings: {default_compute: azureml:cpu}
    inputs: {d: {type: uri_folder, path: ./data}}
    jobs:
      fit:
        type: command
        component: ./train.yml
        inputs: {data: "${{parent.inputs.d}}", rate: 0.5}
      refit:
        component: file:./train.yml
        inputs: {data: "${{parent.inputs.d}}"}
      read:
        component:
          type: command
          inputs: {folder: {type: mlflow_model}}
          environment: azureml:e:1
          command: ls ${{inputs.folder}}
        inputs: {folder: "${{parent.jobs.fit.outputs.model}}"}
      shared:
        component: azureml:reader:2
        inputs: {folder: {type: uri_folder, path: ./data}}
    """
    asked: list[str] = []
    spec = load(files, text, components=lambda ref: asked.append(ref) or {**READER, "name": "reader", "version": "2"})
    assert asked == ["azureml:reader:2"]
    fit, refit, read, shared = spec.steps.values()
    assert fit.component_ref.kind == refit.component_ref.kind == "file"
    assert fit.component.name == "fit" and fit.component_ref.ref == str(files / "train.yml")
    assert read.component_ref.kind == "inline" and read.upstream == ("fit",)
    assert shared.component_ref.kind == "registered" and shared.component.command == "ls ${{inputs.folder}}"
    def missing(ref: str) -> dict[str, Any]:
        raise NotFoundError("component", ref.removeprefix("azureml:"))

    assert refused(files, text, components=missing).startswith("jobs.shared.component: component 'reader:2' not found")
    unresolved = load(files, text)  # no registry: its ports are unknown, the step is kept
    assert unresolved.steps["shared"].component is None
    with pytest.raises(ConfigError, match="^jobs.shared.component: azureml:reader:2 was not resolved"):
        stepio.step_job_dict(unresolved, "shared", "c1", {})
    bad = text.replace("{type: mlflow_model}", "{type: uri_file}")
    assert refused(files, bad).startswith("jobs.read.inputs.folder: a uri_file input bound to fit's mlflow_model output")


def test_a_sweep_step_is_kept_for_the_sweep_runner(files: Path) -> None:
    spec = load(files, """
    type: pipeline
    compute: azureml:cpu
    jobs:
      tune:
        type: sweep
        trial: ./train.yml
        inputs: {data: {type: uri_folder, path: ./data}}
        search_space: {rate: {type: uniform, min_value: 0.01, max_value: 0.1}}
        sampling_algorithm: random
        objective: {goal: maximize, primary_metric: acc}
        limits: {max_total_trials: 2}
      use:
        command: ls ${{inputs.m}}
        environment: azureml:e:1
        inputs: {m: "${{parent.jobs.tune.outputs.model}}"}
    """)
    tune = spec.steps["tune"]
    assert tune.type == "sweep" and tune.job["search_space"]["rate"]["type"] == "uniform"
    assert tune.component.name == "fit" and spec.steps["use"].upstream == ("tune",)
    with pytest.raises(ConfigError, match="^jobs.tune.type: a sweep step"):
        stepio.step_job_dict(spec, "tune", "c1", {})


BASE = """
type: pipeline
compute: azureml:cpu
inputs: {d: {type: uri_folder, path: ./data}, f: {type: uri_file, path: ./data/x.csv}}
outputs: {final: {type: uri_file}}
jobs:
  fit:
    component: ./train.yml
    inputs: {data: "${{parent.inputs.d}}"}
"""


@pytest.mark.parametrize(("extra", "expected"), [
    ("  use:\n    command: ls\n    environment: azureml:e:1\n    inputs: {x: \"${{parent.jobs.fitt.outputs.model}}\"}\n",
     "jobs.use.inputs.x: ${{parent.jobs.fitt.outputs.model}} names no step; the pipeline's steps: fit, use"),
    ("  use:\n    command: ls\n    environment: azureml:e:1\n    inputs: {x: \"${{parent.jobs.fit.outputs.modl}}\"}\n",
     "jobs.use.inputs.x: ${{parent.jobs.fit.outputs.modl}}: step fit has no output 'modl'; its outputs: model, table"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.jobs.fit.outputs.table}}\"}\n",
     "jobs.use.inputs.data: a uri_folder input bound to fit's mltable output 'table'"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.inputs.f}}\"}\n",
     "jobs.use.inputs.data: a uri_folder input bound to the pipeline's uri_file input 'f'"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.inputs.g}}\"}\n",
     "jobs.use.inputs.data: ${{parent.inputs.g}}: the pipeline has no input 'g'"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.inputs.d}}\", epochs: 3}\n",
     "jobs.use.inputs.epochs: the step's component has no input 'epochs'"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.inputs.d}}\"}\n    outputs: {model: \"${{parent.outputs.final}}\"}\n",
     "jobs.use.outputs.model: a mlflow_model output bound to the pipeline's uri_file output 'final'"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.inputs.d}}\"}\n    outputs: {model: \"${{parent.outputs.last}}\"}\n",
     "jobs.use.outputs.model: ${{parent.outputs.last}}: the pipeline has no output 'last'"),
    ("  use:\n    component: ./train.yml\n    inputs: {data: \"${{parent.outputs.final}}\"}\n",
     "jobs.use.inputs.data: ${{parent.outputs.final}} is a pipeline output"),
    ("  use:\n    command: ls\n    inputs: {x: 1}\n", "jobs.use.environment: missing"),
    ("  use:\n    command: ls\nsettings: {environment: {image: python}}\n",
     "jobs.use.environment: missing; give the step's environment (settings.environment is not applied"),
    ("  Use:\n    command: ls\n    environment: azureml:e:1\n", "jobs.Use: 'Use' is not a step name"),
    ("  use:\n    type: parallel\n    component: ./train.yml\n", "jobs.use.type: parallel steps are not emulated"),
    ("  use:\n    command: ls\n    environment: azureml:e:1\n    retries: 2\n", "jobs.use.retries: unknown field"),
    ("  use:\n    component: ./missing.yml\n", "jobs.use.component: "),
    ("  use:\n    component: ./train.yml\n    command: echo\n", "jobs.use.command: is the component's, not the step's"),
    ("  use:\n    type: sweep\n    search_space: {}\n", "jobs.use.trial: missing"),
])
def test_each_refusal_is_one_line_naming_the_step_and_field(files: Path, extra: str, expected: str) -> None:
    assert refused(files, BASE + extra).startswith(expected)


def test_a_pipeline_output_bound_twice_a_cycle_and_no_compute(files: Path) -> None:
    twice = BASE.replace("outputs: {final: {type: uri_file}}", "outputs: {final: }") + (
        "    outputs: {model: \"${{parent.outputs.final}}\"}\n  again:\n    component: ./train.yml\n"
        "    inputs: {data: \"${{parent.inputs.d}}\"}\n    outputs: {table: {path: \"${{parent.outputs.final}}\"}}\n")
    assert refused(files, twice).startswith("jobs.again.outputs.table: the pipeline's output 'final' is already "
                                            "bound by jobs.fit.outputs.model")
    cycle = """
    type: pipeline
    compute: azureml:cpu
    jobs:
      a: {component: ./train.yml, inputs: {data: {type: mlflow_model, path: "${{parent.jobs.c.outputs.model}}"}}}
      b: {component: ./train.yml, inputs: {data: {type: mlflow_model, path: "${{parent.jobs.a.outputs.model}}"}}}
      c: {component: ./train.yml, inputs: {data: {type: mlflow_model, path: "${{parent.jobs.b.outputs.model}}"}}}
      d: {component: ./train.yml, inputs: {data: {type: mlflow_model, path: "${{parent.jobs.c.outputs.model}}"}}}
    """
    message = refused(files, cycle)
    assert message.startswith("jobs.") and "the steps form a cycle: " in message
    assert {"a -> b -> c -> a", "b -> c -> a -> b", "c -> a -> b -> c"} & {message.split("cycle: ")[1].split(";")[0]}
    no_compute = refused(files, BASE.replace("compute: azureml:cpu\n", ""))
    assert no_compute.startswith("jobs.fit.compute: compute not set") and "settings.default_compute: serverless" in no_compute
    assert refused(files, "type: pipeline\njobs: {}\n").startswith("jobs: missing")
    assert refused(files, BASE.replace("{type: uri_file}}", "{type: csv}}")).startswith("outputs.final.type: 'csv' is not")
    assert refused(files, BASE + "pipeline_settings: {}\n").startswith("pipeline_settings: unknown field")


DIAMOND = """
type: pipeline
compute: azureml:cpu
settings: {continue_on_step_failure: %s}
jobs:
  top: {component: ./train.yml, inputs: {data: {type: uri_folder, path: ./data}}}
  left: {component: ./train.yml, inputs: {data: {type: mlflow_model, path: "${{parent.jobs.top.outputs.model}}"}}}
  right: {component: ./train.yml, inputs: {data: {type: mlflow_model, path: "${{parent.jobs.top.outputs.model}}"}}}
  join:
    command: ls ${{inputs.l}} ${{inputs.r}}
    environment: azureml:e:1
    inputs: {l: "${{parent.jobs.left.outputs.table}}", r: "${{parent.jobs.right.outputs.model}}"}
  alone: {component: ./train.yml, inputs: {data: {type: uri_folder, path: ./data}}}
"""


def test_the_graph_parallel_branches_and_a_diamond(files: Path) -> None:
    spec = load(files, DIAMOND % "false")
    assert graph.dependencies(spec)["join"] == ("left", "right")
    assert graph.dependents(spec)["top"] == ("left", "right")
    assert graph.topological_order(spec) == ["top", "alone", "left", "right", "join"]
    assert graph.ready(spec, {}) == ["top", "alone"]  # independent steps start together
    done = RunStatus.COMPLETED
    assert graph.ready(spec, {"top": done, "alone": RunStatus.RUNNING}) == ["left", "right"]
    assert graph.ready(spec, {"top": done, "alone": done, "left": done, "right": RunStatus.RUNNING}) == []
    assert graph.ready(spec, {"top": "Completed", "alone": "Completed", "left": "Completed", "right": "Completed"}) == ["join"]
    every = {name: done for name in spec.steps}
    assert graph.finished(spec, every) and graph.pipeline_status(spec, every) is RunStatus.COMPLETED
    assert graph.pipeline_status(spec, {"top": done}) is RunStatus.RUNNING
    assert graph.downstream(spec, "left") == ["join"] and graph.downstream(spec, "top") == ["left", "right", "join"]


def test_a_failed_steps_blast_radius_both_ways(files: Path) -> None:
    states = {"top": RunStatus.COMPLETED, "alone": RunStatus.RUNNING, "left": RunStatus.FAILED,
              "right": RunStatus.RUNNING}
    stop = load(files, DIAMOND % "false")  # Azure ML's default: everything not finished stops
    assert graph.after_failure(stop, "left", states) == graph.FailurePlan(not_run=("join",), cancel=("alone", "right"))
    assert graph.ready(stop, states) == []
    go_on = load(files, DIAMOND % "true")  # only what reads the failed step stops
    assert graph.after_failure(go_on, "left", states) == graph.FailurePlan(not_run=("join",), cancel=())
    assert graph.after_failure(go_on, "top", {"top": RunStatus.FAILED}).not_run == ("left", "right", "join")
    assert graph.ready(go_on, {"top": RunStatus.COMPLETED, "left": RunStatus.FAILED}) == ["alone", "right"]
    ended = {**states, "alone": RunStatus.COMPLETED, "right": RunStatus.COMPLETED}
    assert graph.finished(go_on, ended) and graph.pipeline_status(go_on, ended) is RunStatus.FAILED
    canceled = {**ended, "left": RunStatus.COMPLETED, "right": RunStatus.CANCELED}
    assert graph.pipeline_status(stop, canceled) is RunStatus.CANCELED


def test_types_that_fit() -> None:
    assert compatible("uri_folder", "uri_folder") and compatible(None, "mltable") and compatible("integer", "number")
    assert not compatible("uri_folder", "mltable") and not compatible("mlflow_model", "custom_model")
    assert not compatible("string", "uri_file") and not compatible("uri_file", "uri_folder")


def test_find_cycle_names_the_steps_in_data_flow_order() -> None:
    assert graph.find_cycle({"a": ("c",), "b": ("a",), "c": ("b",), "d": ("c",)}) in (
        ["a", "b", "c", "a"], ["b", "c", "a", "b"], ["c", "a", "b", "c"])
    assert graph.find_cycle({"a": (), "b": ("a", "ghost")}) is None
    assert graph.find_cycle({"self": ("self",)}) == ["self", "self"]


KEY = {"component": {"name": "fit", "version": "1", "command": "echo ${{inputs.x}}", "environment": "e:1",
                     "description": "d", "inputs": {"x": {"type": "number"}}},
       "code_hash": "c0de", "environment": "azureml:e:1", "input_hashes": {"data": "aaa"},
       "parameters": {"x": 1, "s": "a"}, "run_fields": {"environment_variables": {"A": "1"}}}


def test_the_reuse_key_is_stable_changed_by_each_ingredient_and_off_when_it_must_be() -> None:
    key = graph.reuse_key(**KEY)
    assert key and len(key) == 64 and graph.reuse_key(**KEY) == key
    reordered = {**KEY, "parameters": {"s": "a", "x": 1}}
    assert graph.reuse_key(**reordered) == key
    cosmetic = {**KEY, "component": {**KEY["component"], "version": "2", "description": "other", "tags": {"t": "v"}}}
    assert graph.reuse_key(**cosmetic) == key  # a new version of the same work is reused
    changes = [
        {"component": {**KEY["component"], "command": "echo ${{inputs.x}} !"}},
        {"code_hash": "c0df"}, {"code_hash": None}, {"environment": "azureml:e:2"},
        {"input_hashes": {"data": "aab"}}, {"input_hashes": {"data": "aaa", "more": "bbb"}},
        {"parameters": {"x": 2, "s": "a"}}, {"parameters": {"x": "1", "s": "a"}},
        {"run_fields": {"environment_variables": {"A": "2"}}},
    ]
    keys = {graph.reuse_key(**{**KEY, **change}) for change in changes}
    assert key not in keys and len(keys) == len(changes)
    assert graph.reuse_key(**KEY, is_deterministic=False) is None
    assert graph.reuse_key(**KEY, force_rerun=True) is None


def test_a_steps_reuse_key(files: Path) -> None:
    spec = load(files, DIAMOND % "false")
    ingredients = {"code_hash": "c0de", "input_hashes": {"data": "aaa"}, "parameters": {"rate": 0.1}}
    key = stepio.step_reuse_key(spec, "top", **ingredients)
    assert key and key == stepio.step_reuse_key(load(files, DIAMOND % "false"), "top", **ingredients)
    assert stepio.step_reuse_key(spec, "left", **ingredients) == key  # the same component and contents
    moved = load(files, DIAMOND.replace("compute: azureml:cpu", "compute: azureml:gpu") % "false")
    assert stepio.step_reuse_key(moved, "top", **ingredients) == key
    other = load(files, DIAMOND.replace("alone: {component: ./train.yml,", "alone: {component: ./train.yml, "
                                        "environment_variables: {SEED: '2'},") % "false")
    assert stepio.step_reuse_key(other, "alone", **ingredients) != key
    assert stepio.step_reuse_key(spec, "join", **ingredients) not in (key, None)
    rerun = load(files, DIAMOND.replace("settings: {", "settings: {force_rerun: true, ") % "false")
    assert stepio.step_reuse_key(rerun, "top", **ingredients) is None
    (files / "train.yml").write_text(TRAIN + "is_deterministic: false\n")
    assert stepio.step_reuse_key(load(files, DIAMOND % "false"), "top", **ingredients) is None


def test_outputs_go_to_azure_mls_default_path_or_where_they_are_bound(files: Path) -> None:
    spec = load(files, INLINE)
    assert stepio.output_spec(spec, "make", "out", "child-1") == {
        "type": "uri_folder", "path": "azureml://datastores/lake/paths/azureml/child-1/out/"}
    assert stepio.output_spec(spec, "check", "result", "child-2") == {
        "type": "uri_folder", "path": "azureml://datastores/lake/paths/azureml/child-2/result/", "mode": "upload"}
    assert stepio.pipeline_outputs(spec, {"check": "child-2"})["report"]["path"].endswith("/child-2/result/")
    assert stepio.expand_macros("azureml://datastores/${{default_datastore}}/paths/${{name}}/${{output_name}}.txt",
                                "j1", "o", "ws") == "azureml://datastores/ws/paths/j1/o.txt"


def test_an_output_path_with_azure_mls_macros_and_a_typed_pipeline_output(files: Path) -> None:
    spec = load(files, """
    type: pipeline
    settings: {default_compute: serverless}
    outputs:
      single: {type: uri_file, mode: rw_mount, path: "azureml://datastores/workspaceblobstore/paths/${{name}}/one.txt"}
    jobs:
      write:
        command: echo 1 > ${{outputs.file}} && echo 2 > ${{outputs.folder}}/two.txt
        environment: azureml:e:1
        outputs:
          file: "${{parent.outputs.single}}"
          folder: {type: uri_folder, path: "azureml://datastores/workspaceblobstore/paths/${{name}}/${{output_name}}/"}
    """)
    outputs = stepio.step_outputs(spec, "write", "child-7")
    assert outputs["file"] == {"type": "uri_file", "mode": "rw_mount",
                               "path": "azureml://datastores/workspaceblobstore/paths/child-7/one.txt"}
    assert outputs["folder"]["path"] == "azureml://datastores/workspaceblobstore/paths/child-7/folder/"


def test_each_step_becomes_a_command_job(files: Path) -> None:
    spec = load(files, INLINE)
    bound = stepio.bind_inputs(spec, "check", {"make": "child-1"})
    assert bound == {"got": {"type": "uri_folder", "path": "azureml://datastores/lake/paths/azureml/child-1/out/",
                             "mode": "download"}, "label": "n=3"}
    assert stepio.split_inputs(bound) == ({"label": "n=3"}, {"got": bound["got"]})
    with pytest.raises(ConfigError, match="^jobs.check.inputs.got: step make has not run yet"):
        stepio.bind_inputs(spec, "check", {})
    job = job_from_dict(stepio.step_job_dict(spec, "make", "child-1", {}), base_dir=Path(spec.base_dir))
    assert (job.compute, job.display_name, job.experiment_name) == ("cpu", "make", "pipes")
    assert job.inputs["n"] == 3 and job.inputs["src"].path == str(files / "data")
    assert job.outputs["out"].path == "azureml://datastores/lake/paths/azureml/child-1/out/"


def test_a_component_step_becomes_its_components_command_job(files: Path) -> None:
    spec = load(files, DIAMOND % "false")
    data = stepio.step_job_dict(spec, "left", "child-l", {"top": "child-t"})
    job = job_from_dict(data, base_dir=Path(spec.base_dir))
    assert job.inputs["data"].path == "azureml://datastores/workspaceblobstore/paths/azureml/child-t/model/"
    assert job.outputs["table"].path.endswith("/azureml/child-l/table/") and job.compute == "cpu"
    assert "--tag" not in job.command  # the optional input has no value: its part is dropped
    assert isinstance(spec.steps["top"].inputs["data"].binding, Literal)


def test_not_a_pipeline(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^type: this is not a pipeline job"):
        pipeline_from_dict({"type": "command"}, base_dir=tmp_path)
    assert not is_pipeline_file(tmp_path / "none.yml")
