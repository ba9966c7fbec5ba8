"""Pipelines and components through `amlemu serve` (issue 29): the REST bodies azure-ai-ml makes of a
`@dsl.pipeline` job and of a component become the `type: pipeline` YAML and the component YAML the
emulator reads (pure, no network), and the unchanged SDK against the in-process service on process
nodes: components.create_or_update / get (version, label) / list over the registry `amlemu component`
uses, a two-step pipeline (one step's output feeding the next) submitted, streamed, read back with
its steps as child jobs and its output downloaded, a pipeline the Python API submitted read back as a
PipelineJob and canceled with its running step, and a bad body's one-line 400 naming the field."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import requests
from conftest import wait_until
from test_service import WS, live  # noqa: F401 - the in-process service fixture

from amlemu.api import Emulator
from amlemu.pipelines.pipelinespec import pipeline_from_dict
from amlemu.pipelines.registry import Components
from amlemu.service.state import ServiceError, componentrest, pipelinerest
from amlemu.storage.datastores import DatastoreSpec

PREP = """name: prep_q3
type: command
version: "1"
inputs:
  word: {type: string, default: hi}
outputs:
  out_dir: {type: uri_folder}
code: ./src
environment: azureml:AzureML-sklearn-1.5@latest
command: python prep.py ${{inputs.word}} ${{outputs.out_dir}}
"""
TRAIN = """name: train_q3
type: command
inputs:
  data: {type: uri_folder}
  n: {type: integer, default: 2}
outputs:
  model: {type: uri_folder}
code: ./src
environment: azureml:AzureML-sklearn-1.5@latest
command: python train.py ${{inputs.data}} ${{inputs.n}} ${{outputs.model}}
"""
SLOW = """name: slow_q3
type: command
inputs:
  seconds: {type: integer, default: 120}
code: ./src
environment: azureml:AzureML-sklearn-1.5@latest
command: python -c "import time, sys; time.sleep(int(sys.argv[1]))" ${{inputs.seconds}}
"""
PREP_PY = "import sys, pathlib\npathlib.Path(sys.argv[2], 'data.txt').write_text(sys.argv[1] * 2)\n"
TRAIN_PY = ("import sys, pathlib\ntext = pathlib.Path(sys.argv[1], 'data.txt').read_text()\n"
            "pathlib.Path(sys.argv[3], 'model.txt').write_text(text * int(sys.argv[2]))\n")
COMPONENT_ID = f"{WS}/components/azureml_anonymous/versions/0f0f"


def _files(root: Path) -> Path:
    (root / "src").mkdir(parents=True)
    (root / "src" / "prep.py").write_text(PREP_PY)
    (root / "src" / "train.py").write_text(TRAIN_PY)
    for name, text in (("prep", PREP), ("train", TRAIN), ("slow", SLOW)):
        (root / f"{name}.yml").write_text(text)
    return root


def _pipeline(root: Path, prep: Any = None) -> Any:
    """The two-step pipeline: prep's folder feeds train, train's model is the pipeline's output."""
    from azure.ai.ml import dsl, load_component  # noqa: PLC0415

    prep, train = prep or load_component(root / "prep.yml"), load_component(root / "train.yml")

    @dsl.pipeline(default_compute="c1", description="prep then train")
    def prep_and_train(word="ab"):  # type: ignore[no-untyped-def] # noqa: ANN001, ANN202 - dsl reads no string annotations
        made = prep(word=word)
        trained = train(data=made.outputs.out_dir, n=3)
        return {"final": trained.outputs.model}

    job = prep_and_train(word="xy")
    job.experiment_name = "pipes"
    return job


# --- the REST bodies -> the emulator's YAML (pure) --------------------------------------------------
def _body(root: Path) -> dict[str, Any]:
    """What jobs.create_or_update PUTs, its components registered (the SDK then sends their ids)."""
    job = _pipeline(root)
    job.jobs["made"].resources = {"instance_count": 2}
    job.jobs["made"].distribution = {"type": "mpi", "process_count_per_instance": 2}
    job.jobs["made"].outputs.out_dir.mode = "upload"
    job.jobs["trained"].inputs.data.mode = "download"
    job.jobs["trained"].compute = "c2"
    for node in job.jobs.values():
        node._component = COMPONENT_ID
    return job._to_rest_object().as_dict()


@pytest.fixture(scope="module")
def sdk_body(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The project's files and the pipeline body the SDK makes of them, made once for these tests."""
    root = _files(tmp_path_factory.mktemp("project"))
    return root, _body(root)


def test_the_sdks_pipeline_body_becomes_the_pipeline_yaml(sdk_body: tuple[Path, dict[str, Any]]) -> None:
    root, body = sdk_body[0], copy.deepcopy(sdk_body[1])
    step = body["properties"]["jobs"]["trained"]["inputs"]["data"]
    assert step == {"value": "${{parent.jobs.made.outputs.out_dir}}", "job_input_type": "literal", "mode": "Download"}
    asked: list[tuple[str, str]] = []
    data = pipelinerest.to_yaml("p1", body, lambda ref, field: asked.append((ref, field)) or "azureml:prep_q3:1")
    assert asked == [(COMPONENT_ID, "jobs.made.componentId"), (COMPONENT_ID, "jobs.trained.componentId")]
    assert data == {
        "type": "pipeline", "name": "p1", "display_name": "prep_and_train", "description": "prep then train",
        "experiment_name": "pipes", "settings": {"default_compute": "c1"},
        "inputs": {"word": "xy"}, "outputs": {"final": {"type": "uri_folder"}},
        "jobs": {"made": {"type": "command", "component": "azureml:prep_q3:1", "inputs": {"word": "${{parent.inputs.word}}"},
                          "outputs": {"out_dir": {"type": "uri_folder", "mode": "upload"}},
                          "resources": {"instance_count": 2},
                          "distribution": {"type": "mpi", "process_count_per_instance": 2}},
                 "trained": {"type": "command", "component": "azureml:prep_q3:1", "compute": "c2",
                             "inputs": {"data": {"path": "${{parent.jobs.made.outputs.out_dir}}", "mode": "download"},
                                        "n": "3"},
                             "outputs": {"model": "${{parent.outputs.final}}"}}}}
    for spelled in (body["properties"]["inputs"]["word"], body["properties"]["jobs"]["made"]["inputs"]["word"]):
        spelled.update({k: "Literal" for k in ("jobInputType", "job_input_type") if k in spelled})  # REST's other spelling
    assert pipelinerest.to_yaml("p1", body, lambda ref, field: "azureml:prep_q3:1") == data
    data["jobs"]["trained"]["component"] = "azureml:train_q3:1"
    registered = {f"azureml:{n}_q3:1": {**_yaml(root / f"{n}.yml"), "code": str(root / "src")} for n in ("prep", "train")}
    spec = pipeline_from_dict(data, base_dir=root, components=registered.__getitem__)  # as `job validate` reads it
    assert list(spec.steps) == ["made", "trained"] and spec.steps["trained"].upstream == ("made",)
    assert spec.bound_outputs() == {"final": ("trained", "model")} and spec.steps["trained"].compute == "c2"


def test_a_sweep_step_of_the_sdk_becomes_the_yamls_sweep_step(sdk_body: tuple[Path, dict[str, Any]]) -> None:
    from azure.ai.ml import dsl, load_component  # noqa: PLC0415
    from azure.ai.ml.sweep import BanditPolicy, Choice  # noqa: PLC0415

    root = sdk_body[0]
    train = load_component(root / "train.yml")

    @dsl.pipeline(default_compute="c1")
    def tuned(data):  # type: ignore[no-untyped-def] # noqa: ANN001, ANN202
        sweep = train(data=data, n=Choice([1, 2])).sweep(
            primary_metric="acc", goal="maximize", sampling_algorithm="grid",
            early_termination_policy=BanditPolicy(slack_factor=0.5, evaluation_interval=1))
        sweep.set_limits(max_total_trials=2, timeout=600)
        return {"best": sweep.outputs.model}

    job = tuned(data="azureml://datastores/workspaceblobstore/paths/d/")
    job.jobs["sweep"]._component = COMPONENT_ID
    body = job._to_rest_object().as_dict()
    assert body["properties"]["jobs"]["sweep"]["early_termination"]["policy_type"] == "Bandit"  # REST's word
    data = pipelinerest.to_yaml("p1", body, lambda ref, field: "azureml:train_q3:1")
    assert data["jobs"]["sweep"] == {
        "type": "sweep", "trial": "azureml:train_q3:1", "inputs": {"data": "${{parent.inputs.data}}"},
        "outputs": {"model": "${{parent.outputs.best}}"}, "search_space": {"n": {"type": "choice", "values": [1, 2]}},
        "sampling_algorithm": "grid", "objective": {"goal": "maximize", "primary_metric": "acc"},
        "limits": {"max_total_trials": 2, "timeout": 600},
        "early_termination": {"type": "bandit", "slack_factor": 0.5, "evaluation_interval": 1, "delay_evaluation": 0}}
    registered = {"azureml:train_q3:1": {**_yaml(root / "train.yml"), "code": str(root / "src")}}
    spec = pipeline_from_dict(data, base_dir=root, components=registered.__getitem__)
    assert spec.steps["sweep"].type == "sweep" and spec.bound_outputs() == {"best": ("sweep", "model")}


def _yaml(path: Path) -> dict[str, Any]:
    import yaml  # noqa: PLC0415

    return yaml.safe_load(path.read_text())


@pytest.mark.parametrize(("change", "message"), [
    (lambda p: p.pop("jobs"), r"^jobs: missing"),
    (lambda p: p["jobs"]["made"].update(type="parallel"), r"^jobs\.made\.type: parallel steps are not emulated"),
    (lambda p: p["jobs"]["made"].update(type="sweep", early_termination={"policy_type": "Quick"}),
     r"^jobs\.made\.trial\.componentId: missing"),
    (lambda p: p["jobs"]["made"].update(type="sweep", trial={"componentId": COMPONENT_ID},
                                        early_termination={"policy_type": "Quick"}),
     r"^jobs\.made\.early_termination\.policyType: unknown early termination policy 'Quick'"),
    (lambda p: p["jobs"]["made"].pop("componentId"), r"^jobs\.made\.componentId: missing"),
    (lambda p: p["jobs"]["made"].update(task={"x": 1}), r"^jobs\.made\.task: not emulated"),
    (lambda p: p["jobs"]["made"]["inputs"].update(word={"job_input_type": "mlflow_thing", "uri": "x"}),
     r"^jobs\.made\.inputs\.word\.job_input_type: 'mlflow_thing' inputs are not emulated"),
])
def test_a_bad_pipeline_body_is_refused_in_one_line_naming_the_field(sdk_body: tuple[Path, dict[str, Any]], change: Any,
                                                                    message: str) -> None:
    body = copy.deepcopy(sdk_body[1])
    change(body["properties"])
    with pytest.raises(ServiceError, match=message) as err:
        pipelinerest.to_yaml("p1", body, lambda ref, field: "azureml:prep_q3:1")
    assert err.value.status == 400 and "\n" not in str(err.value)


def test_a_component_body_becomes_the_component_yaml(tmp_path: Path) -> None:
    from azure.ai.ml import load_component  # noqa: PLC0415

    root = _files(tmp_path)
    spec = load_component(root / "train.yml")._to_rest_object().as_dict()["properties"]["componentSpec"]
    spec.update(code=f"azureml:{WS}/codes/c0de/versions/1", environment="azureml:AzureML-sklearn-1.5@latest")
    spec["inputs"]["n"]["type"] = "Integer"  # REST's spelling of a type
    loaded = componentrest.load(spec, "train_q3", "4", lambda name, version: root / "src",
                                lambda env: env.replace("@latest", ""), anonymous=False)
    assert (loaded.name, loaded.version, loaded.code, loaded.inputs["n"].default) == ("train_q3", "4", str(root / "src"), 2)
    assert loaded.environment == "azureml:AzureML-sklearn-1.5"
    for bad, message in ((dict(code=str(root / "src")), r"^componentSpec\.code: .* is not a code asset id"),
                         (dict(command=""), r"^componentSpec\.command: missing")):
        with pytest.raises(ServiceError, match=message):
            componentrest.load({**spec, **bad}, "train_q3", "4", lambda n, v: root / "src", str, anonymous=False)


# --- the unchanged SDK against the service ----------------------------------------------------------
def test_azure_ai_ml_pipelines_and_components_through_the_service(live, tmp_path: Path, capsys) -> None:  # noqa: F811
    from azure.ai.ml import MLClient, load_component  # noqa: PLC0415
    from azure.ai.ml.entities import AmlCompute  # noqa: PLC0415
    from azure.core.exceptions import ResourceExistsError  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    url, bearer, ca = live
    root = _files(tmp_path / "project")
    emu = Emulator(tmp_path / "emu", backend="process")  # the service's home (the fixture's)
    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    ml_client.compute.begin_create_or_update(AmlCompute(name="c1", size="STANDARD_D2_V2", max_instances=2)).result()

    # Components: registered in the registry `amlemu component` reads; get by version and by label; list.
    prep = ml_client.components.create_or_update(load_component(root / "prep.yml"))
    slow = ml_client.components.create_or_update(load_component(root / "slow.yml"))  # no version: the next, 1
    assert (prep.name, prep.version, slow.version) == ("prep_q3", "1", "1")
    assert Components(emu.store).lookup("slow_q3", "1")["command"].startswith("python -c")
    assert ml_client.components.get("prep_q3", version="1").version == ml_client.components.get("prep_q3").version == "1"
    assert ml_client.components.get("slow_q3", label="latest").inputs["seconds"].default == 120
    changed = load_component(root / "prep.yml")
    changed.command += " --again"
    with pytest.raises(ResourceExistsError, match="prep_q3 version 1 already exists with other content"):
        ml_client.components.create_or_update(changed)  # a version never changes

    # A pipeline the Python API submits from a YAML naming the registered component: a PipelineJob to the SDK.
    (root / "slow_pipeline.yml").write_text("type: pipeline\nsettings: {default_compute: azureml:c1}\n"
                                            "jobs:\n  nap:\n    component: azureml:slow_q3:1\n")
    napping = emu.submit(root / "slow_pipeline.yml").id
    shown = ml_client.jobs.get(napping)
    assert type(shown).__name__ == "PipelineJob" and list(shown.jobs) == ["nap"]

    # The @dsl.pipeline: its first step the registered prep, its second an anonymous component; its
    # outputs on a local datastore (no Azurite to start).
    emu.datastores.create(DatastoreSpec("steps", "local", folder=str(tmp_path / "steps")))
    job = _pipeline(root, prep=prep)
    job.settings.default_datastore = "azureml:steps"
    job = ml_client.jobs.create_or_update(job)
    assert type(job).__name__ == "PipelineJob" and job.status in ("Queued", "Preparing", "Running")
    ml_client.jobs.stream(job.name)  # ends with the pipeline; prints its execution log
    assert f"step trained started as {job.name}_trained" in capsys.readouterr().out
    done = ml_client.jobs.get(job.name)
    assert (done.status, done.settings.default_compute) == ("Completed", "c1")
    assert done.outputs["final"].path == f"azureml://datastores/steps/paths/azureml/{job.name}_trained/model/"
    children = list(ml_client.jobs.list(parent_job_name=job.name))
    assert [(c.name, c.display_name, c.status) for c in children] == [
        (f"{job.name}_made", "made", "Completed"), (f"{job.name}_trained", "trained", "Completed")]
    assert {j.name for j in ml_client.jobs.list()} == {job.name, napping}  # steps are their pipelines'
    ml_client.jobs.download(job.name, output_name="final", download_path=tmp_path / "dl")
    assert (tmp_path / "dl" / "named-outputs" / "final" / "model.txt").read_text() == "xyxy" * 3
    assert sorted(c.name for c in ml_client.components.list()) == ["prep_q3", "slow_q3"]  # train's is anonymous

    # Cancel: the pipeline and its running step end Canceled.
    wait_until(lambda: [c.status for c in ml_client.jobs.list(parent_job_name=napping)] == ["Running"], 60,
               "the slow pipeline's step runs")
    ml_client.jobs.begin_cancel(napping).result()
    wait_until(lambda: ml_client.jobs.get(napping).status == "Canceled", 60, "the pipeline is canceled")
    assert [c.status for c in ml_client.jobs.list(parent_job_name=napping)] == ["Canceled"]

    # A body no SDK would send: Azure's 400, one line naming the field; nothing submitted.
    body = {"properties": {"jobType": "Pipeline", "settings": {"default_compute": "c1"}, "jobs": {"a": {
        "type": "command", "componentId": f"{WS}/components/prep_q3/versions/1",
        "inputs": {"word": {"job_input_type": "literal", "value": "${{parent.jobs.nowhere.outputs.x}}"}}}}}}
    reply = requests.put(f"{url}{WS}/jobs/bad-pipe", json=body, headers=bearer, verify=ca,
                         params={"api-version": "2024-01-01-preview"}, timeout=30)
    error = reply.json()["error"]
    assert reply.status_code == 400 and error["message"].startswith("jobs.a.inputs.word") and "\n" not in error["message"]
    assert not emu.store.run_exists("bad-pipe")
