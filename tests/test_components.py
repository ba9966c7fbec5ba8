"""Command components (issue 29): az ml's component YAML read field by field, its `$[[...]]`
optional parts by Azure ML's documented rule, each refusal one line naming the field, the command
job a step runs (read back by the command job's own reader), registered components and their
`azureml:` references, and `amlemu component create|list|show`. Pure and fast: no job runs."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from amlemu.cli import cli
from amlemu.errors import ConfigError
from amlemu.pipelines.component import (
    ComponentInput,
    component_from_dict,
    component_job,
    load_component,
    render_command,
    to_job_dict,
)
from amlemu.pipelines.registry import parse_component_ref, resolve_component_ref
from amlemu.specs import DataInput, DataMode, DistributionType

COMMAND = ("python train.py --data ${{inputs.data}} --lr ${{inputs.lr}} $[[--epochs ${{inputs.epochs}}]] "
           "$[[--opt ${{inputs.opt}} --beta ${{inputs.beta}}]] --model ${{outputs.model}}")
FULL: dict[str, Any] = {
    "$schema": "https://azuremlschemas.azureedge.net/latest/commandComponent.schema.json",
    "type": "command", "name": "train_model", "version": 3, "display_name": "Train", "description": "trains",
    "tags": {"team": "vision", "n": 1}, "is_deterministic": False,
    "inputs": {
        "data": {"type": "uri_folder", "mode": "download", "description": "training data"},
        "lr": {"type": "number", "default": 0.01, "min": 0, "max": 1},
        "epochs": {"type": "integer", "optional": True, "min": 1},
        "opt": {"type": "string", "optional": True, "default": "adam", "enum": ["adam", "sgd"]},
        "beta": {"type": "boolean", "optional": True},
        "ckpt": {"type": "custom_model", "optional": True},
    },
    "outputs": {"model": {"type": "mlflow_model", "mode": "upload"}},
    "code": "src", "environment": {"image": "python:3.11-slim", "conda_file": "env/conda.yml"},
    "command": COMMAND, "distribution": {"type": "pytorch", "process_count_per_instance": 2},
    "resources": {"instance_count": 2, "shm_size": "2g"}, "environment_variables": {"A": "1"},
}
DATA = "azureml://datastores/workspaceblobstore/paths/train/"


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print('train')\n")
    (tmp_path / "env").mkdir()
    (tmp_path / "env" / "conda.yml").write_text("dependencies: [python=3.11]\n")
    return tmp_path


def load(folder: Path, **changes: Any) -> Any:
    data = copy.deepcopy(FULL)
    for key, value in changes.items():
        node, *path = key.split("__")
        target = data
        for part in [node, *path][:-1]:
            target = target[part]
        if value is None:
            target.pop([node, *path][-1], None)
        else:
            target[[node, *path][-1]] = value
    return component_from_dict(data, base_dir=folder)


def test_every_field_is_read_and_written_back(folder: Path) -> None:
    comp = load(folder)
    assert (comp.name, comp.version, comp.display_name, comp.description) == ("train_model", "3", "Train", "trains")
    assert comp.tags == {"team": "vision", "n": "1"} and comp.is_deterministic is False
    assert comp.inputs["data"] == ComponentInput("uri_folder", mode="download", description="training data")
    assert comp.inputs["lr"] == ComponentInput("number", 0.01, min=0, max=1)
    assert comp.inputs["opt"] == ComponentInput("string", "adam", optional=True, enum=("adam", "sgd"))
    assert comp.outputs["model"].type == "mlflow_model" and comp.outputs["model"].mode == "upload"
    assert comp.code == str(folder / "src") and comp.environment["conda_file"] == str(folder / "env" / "conda.yml")
    assert comp.distribution == FULL["distribution"] and comp.resources == FULL["resources"]
    again = component_from_dict(json.loads(json.dumps(comp.to_dict())), base_dir=folder / "elsewhere")
    assert again.to_dict() == comp.to_dict()


def test_the_defaults(folder: Path) -> None:
    comp = component_from_dict({"name": "c", "command": "echo hi", "environment": "azureml:env@latest",
                                "inputs": {"x": {"type": "string"}}}, base_dir=folder)
    assert comp.is_deterministic is True and comp.version is None and comp.code is None and comp.outputs == {}
    assert comp.inputs["x"] == ComponentInput("string") and comp.inputs["x"].optional is False
    inline = component_from_dict({"name": "ignored", "version": 9, "command": "echo", "environment": "img:1"},
                                 base_dir=folder, inline=True)
    assert (inline.name, inline.version, inline.label) == (None, None, "inline")


@pytest.mark.parametrize(("given", "epochs", "opt"), [
    ({}, False, False),  # epochs has no value; opt has its default but beta none: both parts dropped
    ({"epochs": 5}, True, False),
    ({"beta": True}, False, True),
    ({"beta": False, "opt": None}, False, True),  # false is a value; opt not given: its default
    ({"epochs": 0, "beta": True, "opt": "sgd"}, True, True),
])
def test_an_optional_part_is_kept_only_when_every_input_it_names_has_a_value(folder: Path, given: dict[str, Any],
                                                                              epochs: bool, opt: bool) -> None:
    """Azure ML's rule: `$[[...]]` kept (brackets gone) when its inputs have values, given or
    default; dropped whole when one has none. Bindings stay for the command job to fill."""
    expected = ("python train.py --data ${{inputs.data}} --lr ${{inputs.lr}} " +
                ("--epochs ${{inputs.epochs}}" if epochs else "") + " " +
                ("--opt ${{inputs.opt}} --beta ${{inputs.beta}}" if opt else "") + " --model ${{outputs.model}}")
    assert render_command(load(folder), {"data": DATA, **given}) == expected


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"colour": "red"}, "colour", "unknown field"),
    ({"additional_includes": ["../lib"]}, "additional_includes", "not emulated"),
    ({"type": "pipeline"}, "type", "not emulated"),
    ({"name": None}, "name", "missing"),
    ({"name": "Train-Model"}, "name", "not a component name"),
    ({"command": None}, "command", "missing"),
    ({"environment": None}, "environment", "missing"),
    ({"inputs__x": {"type": "float"}}, "inputs.x.type", "not an input type"),
    ({"inputs__x": {"type": "string", "colour": 1}}, "inputs.x.colour", "unknown field"),
    ({"inputs__lr__default": "abc"}, "inputs.lr.default", "not a number"),
    ({"inputs__epochs__default": 2.5}, "inputs.epochs.default", "not an integer"),
    ({"inputs__beta__default": "yes"}, "inputs.beta.default", "not a boolean"),
    ({"inputs__lr__default": 2}, "inputs.lr.default", "above the input's max"),
    ({"inputs__lr__min": 2}, "inputs.lr.min", "above max"),
    ({"inputs__opt__default": "rmsprop"}, "inputs.opt.default", "enum"),
    ({"inputs__lr__enum": ["1"]}, "inputs.lr.enum", "only a string input"),
    ({"inputs__opt__max": 3}, "inputs.opt.max", "only an integer or number"),
    ({"inputs__data__default": DATA}, "inputs.data.default", "has no default"),
    ({"inputs__data__mode": "rw_mount"}, "inputs.data.mode", "not a mode"),
    ({"inputs__epochs__optional": "yes"}, "inputs.epochs.optional", "not a boolean"),
    ({"inputs__home": {"type": "string"}}, "inputs.home", "reserves"),
    ({"inputs__model": {"type": "string", "optional": True}}, "outputs.model", "an input has this name"),
    ({"outputs__acc": {"type": "number"}}, "outputs.acc.type", "primitive output"),
    ({"outputs__model__mode": "ro_mount"}, "outputs.model.mode", "not an output mode"),
    ({"command": COMMAND + " ${{inputs.nope}}"}, "command", "${{inputs.nope}} names no declared input"),
    ({"command": COMMAND + " ${{outputs.nope}}"}, "command", "${{outputs.nope}} names no declared"),
    ({"command": COMMAND.replace("$[[--epochs ${{inputs.epochs}}]]", "--epochs ${{inputs.epochs}}")}, "command",
     "optional input epochs must be placed in an optional part"),
    ({"command": COMMAND + " $[[--x ${{inputs.lr}}]]"}, "command", "a required input inside $[[...]]"),
    ({"command": COMMAND + " $[[--x ${{outputs.model}}]]"}, "command", "an output inside $[[...]]"),
    ({"command": COMMAND + " $[[--x"}, "command", "never closed"),
    ({"command": COMMAND + " $[[a $[[b]] c]]"}, "command", "inside another"),
    ({"command": "python train.py \\\n " + COMMAND}, "command", "at the end of a line"),
    ({"code": "nowhere"}, "code", "is not a folder"),
    ({"command": COMMAND.replace("train.py", "gone.py")}, "command", "script gone.py not found"),
    ({"distribution__type": "ray"}, "distribution.type", "not supported"),
    ({"environment_variables": {"1BAD": "x"}}, "environment_variables.1BAD", "not a valid variable name"),
])
def test_each_bad_field_is_one_line_naming_it(folder: Path, changes: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(folder, **changes)
    assert caught.value.field == field and words in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("inputs", "field", "words"), [
    ({}, "inputs.data", "a required input has no value"),
    ({"data": DATA, "lr": None, "nope": 1}, "inputs.nope", "has no input named nope"),
    ({"data": DATA, "lr": "fast"}, "inputs.lr", "not a number"),
    ({"data": DATA, "epochs": 0}, "inputs.epochs", "below the input's min"),
    ({"data": DATA, "opt": "rmsprop"}, "inputs.opt", "enum"),
    ({"data": DATA, "lr": {"value": 1}}, "inputs.lr", "not a mapping"),
    ({"data": {"mode": "download"}}, "inputs.data", "needs a path"),
])
def test_a_step_s_values_are_checked(folder: Path, inputs: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        to_job_dict(load(folder), inputs)
    assert caught.value.field == field and words in str(caught.value)
    with pytest.raises(ConfigError, match="outputs.extra: the component train_model:3 has no output named extra"):
        to_job_dict(load(folder), {"data": DATA}, {"extra": None})


def test_a_step_runs_as_the_command_job_its_component_makes(folder: Path, tmp_path_factory: pytest.TempPathFactory
                                                             ) -> None:
    """to_job_dict -> job_from_dict: the command rendered, values checked and typed, data typed
    and moded as declared, every output (unnamed: Azure ML's default place), the step's settings
    over the component's; relative input paths from the pipeline's folder, the component's own
    files from where it was loaded."""
    pipeline_dir = tmp_path_factory.mktemp("pipeline")
    (pipeline_dir / "data").mkdir()
    job = component_job(load(folder), {"data": "data", "epochs": "4", "ckpt": "azureml:my_model:1"},
                        {"model": {"path": "azureml://datastores/workspaceblobstore/paths/m/"}}, "cpu-cluster",
                        {"environment_variables": {"B": "2"}, "resources": {"instance_count": 3},
                         "display_name": "train step"}, base_dir=pipeline_dir)
    assert job.command == ("python train.py --data ${{inputs.data}} --lr ${{inputs.lr}} --epochs ${{inputs.epochs}} "
                           " --model ${{outputs.model}}")
    assert job.inputs == {"data": DataInput("uri_folder", str(pipeline_dir / "data"), DataMode.DOWNLOAD), "lr": 0.01,
                          "epochs": 4, "opt": "adam", "ckpt": DataInput("uri_folder", "azureml:my_model:1")}
    assert job.outputs == {"model": DataInput("uri_folder", "azureml://datastores/workspaceblobstore/paths/m/",
                                              DataMode.UPLOAD)}
    assert (job.compute, job.instance_count, job.shm_size, job.display_name) == ("cpu-cluster", 3, "2g", "train step")
    assert job.distribution.type is DistributionType.PYTORCH and job.distribution.process_count_per_instance == 2
    assert job.environment_variables == {"A": "1", "B": "2"} and job.code == folder / "src"
    assert job.environment_def["image"] == "python:3.11-slim"
    default = component_job(load(folder), {"data": DATA})
    assert default.outputs["model"].path == "" and default.compute == "serverless"
    with pytest.raises(ConfigError, match="^limit: is not a field a component's step sets"):
        to_job_dict(load(folder), {"data": DATA}, overrides={"limit": 1})


def test_a_component_file_is_read_relative_to_itself(folder: Path) -> None:
    (folder / "train.yml").write_text(yaml.safe_dump({**FULL, "name": "from_file"}))
    comp = load_component(folder / "train.yml")
    assert comp.name == "from_file" and comp.base_dir == str(folder) and comp.code == str(folder / "src")


@pytest.mark.parametrize(("ref", "parsed"), [
    ("azureml:train_model:3", ("train_model", "3")),
    ("azureml:train_model@latest", ("train_model", None)),
    ("azureml:/subscriptions/s/resourceGroups/g/providers/Microsoft.MachineLearningServices/workspaces/w/"
     "components/train_model/versions/3", ("train_model", "3")),
])
def test_a_reference_names_a_version_or_the_latest(ref: str, parsed: tuple[str, str | None]) -> None:
    assert parse_component_ref(ref) == parsed
    registered = {("train_model", "3"): {"name": "train_model", "version": "3", "base_dir": "/x", "command": "c"}}
    found = resolve_component_ref(ref, lambda n, v: registered.get((n, v or "3")), "jobs.train.component")
    assert found == {"name": "train_model", "version": "3", "command": "c"}


@pytest.mark.parametrize(("ref", "words"), [
    ("azureml:train_model", "no version"),
    ("azureml:train_model@prod", "not a label"),
    ("azureml://registries/azureml/components/train/versions/1", "registry are not emulated"),
    ("./train.yml", "not a component reference"),
    ("azureml:other:1", "no registered component other:1"),
])
def test_a_reference_that_resolves_to_nothing_is_one_line(ref: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_component_ref(ref, lambda n, v: None, "jobs.train.component")
    assert caught.value.field == "jobs.train.component" and words in str(caught.value)


def test_component_create_list_show(folder: Path, home: Path) -> None:
    """Registered as az ml registers: the next integer version, the same content again is the same
    version, a version never changes; list shows each one's latest, show a version or @latest."""
    def run(*argv: str) -> Any:
        result = CliRunner().invoke(cli, ["--home", str(home), *argv], env={"AMLEMU_TARGET": "", "AMLEMU_DEBUG": ""})
        return result.exit_code, result.output
    (folder / "train.yml").write_text(yaml.safe_dump({k: v for k, v in FULL.items() if k != "version"}))
    code, out = run("component", "create", "-f", str(folder / "train.yml"), "--dry-run", "-o", "json")
    assert code == 0 and json.loads(out)["actions"][0]["version"] == "1", out
    assert run("component", "list", "-o", "json") == (0, "[]\n")
    first = json.loads(run("component", "create", "-f", str(folder / "train.yml"), "-o", "json")[1])
    assert first["version"] == "1" and first["id"].endswith("/components/train_model/versions/1")
    assert json.loads(run("component", "create", "-f", str(folder / "train.yml"), "-o", "json")[1]) == first
    code, out = run("component", "create", "-f", str(folder / "train.yml"), "--dry-run", "-o", "json")
    assert json.loads(out)["actions"][0]["version"] == "1", out  # the same component: the version it has
    code, out = run("component", "create", "-f", str(folder / "train.yml"), "--set", "description=changed", "-v", "1")
    assert code == 1 and "version 1 already exists with other content" in out
    run("component", "create", "-f", str(folder / "train.yml"), "--set", "description=v2")
    listed = json.loads(run("component", "list", "-o", "json")[1])
    assert [(c["name"], c["version"], c["description"]) for c in listed] == [("train_model", "2", "v2")]
    assert len(json.loads(run("component", "list", "-n", "train_model", "-o", "json")[1])) == 2
    assert json.loads(run("component", "show", "-n", "train_model", "-l", "latest", "-o", "json")[1])["version"] == "2"
    shown = json.loads(run("component", "show", "-n", "train_model", "-v", "1", "-o", "json")[1])
    assert component_from_dict({k: v for k, v in shown.items() if k != "id"}, base_dir=Path("/")).inputs == \
        load(folder).inputs
    code, out = run("component", "show", "-n", "train_model", "-v", "9")
    assert code == 3 and "component 'train_model:9' not found; versions of train_model: 1, 2" in out
    code, out = run("component", "create", "-f", str(folder / "train.yml"), "--set", "inputs.lr.default=x")
    assert code == 1 and out.count("\n") == 1 and "inputs.lr.default" in out
