"""Data and model assets as az ml users register and use them: `amlemu data create|list|show|archive`
and `amlemu model create|list|show` from az ml's YAML and flags, versions and @latest, a local path
uploaded at create, a job's output registered as an asset, and jobs whose inputs name an asset
(`azureml:<name>:<version>`, `@latest`), a job's output, or a model-typed folder."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from test_service import live  # noqa: F401 - the in-process service fixture

from amlemu.api import Emulator
from amlemu.cli.common import cli
from amlemu.errors import ConfigError
from amlemu.jobs.jobspec_io import job_to_record
from amlemu.jobs.jobyaml import job_from_dict, load_job
from amlemu.specs import ClusterSpec, DataMode, RunStatus
from amlemu.storage.assets import asset_from_dict
from amlemu.storage.datastores import DEFAULT, DatastoreSpec
from amlemu.validate import check_job

WS = f"azureml://datastores/{DEFAULT}/paths"


def amlemu(home: Path, *argv: str) -> Any:
    return CliRunner().invoke(cli, ["--home", str(home), *argv], env={"AMLEMU_TARGET": "", "AMLEMU_DEBUG": ""})


def ok(home: Path, *argv: str) -> Any:
    result = amlemu(home, *argv, "-o", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def refused(home: Path, *argv: str) -> str:
    """A user's mistake: exit 1 or 3 and one line, never a traceback."""
    result = amlemu(home, *argv)
    assert result.exit_code in (1, 3), result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1, result.output
    return result.output


def test_data_assets_from_az_ml_yaml_versions_latest_and_archive(home: Path, tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.csv").write_text("x,y\n1,2\n")
    (tmp_path / "folder.yml").write_text(
        "$schema: https://azuremlschemas.azureedge.net/latest/data.schema.json\n"
        "name: local-folder-example\ndescription: a folder from this machine\ntype: uri_folder\npath: data/\n")
    first = ok(home, "data", "create", "-f", str(tmp_path / "folder.yml"))
    assert (first["name"], first["version"], first["type"]) == ("local-folder-example", "1", "uri_folder")
    assert first["path"].startswith(f"{WS}/LocalUpload/") and first["id"].endswith("/data/local-folder-example/versions/1")
    assert [row["path"].rsplit("/", 1)[-1] for row in ok(home, "data", "ls", first["path"])] == ["a.csv"]
    assert ok(home, "data", "create", "-f", str(tmp_path / "folder.yml"))["version"] == "1"  # same data: same version

    (tmp_path / "data" / "b.csv").write_text("x,y\n3,4\n")  # changed data: the next version
    assert ok(home, "data", "create", "-f", str(tmp_path / "folder.yml"))["version"] == "2"
    assert ok(home, "data", "show", "-n", "local-folder-example", "--label", "latest")["version"] == "2"
    assert "version 2 already exists" in refused(home, "data", "create", "-f", str(tmp_path / "folder.yml"),
                                                 "-v", "2", "-p", str(tmp_path / "data" / "a.csv"), "-t", "uri_file")

    cloud = ok(home, "data", "create", "-n", "cloud-file", "-v", "3", "-t", "uri_file", "-p", f"{WS}/example/a.csv")
    assert cloud["path"] == f"{WS}/example/a.csv" and cloud["version"] == "3"  # a datastore path: kept, not copied

    assert ok(home, "data", "archive", "-n", "local-folder-example", "-v", "2") == {"done": ["local-folder-example:2"]}
    assert ok(home, "data", "show", "-n", "local-folder-example", "-l", "latest")["version"] == "1"
    assert ok(home, "data", "show", "-n", "local-folder-example", "-v", "2")["archived"] is True  # still there
    assert [(d["name"], d["version"]) for d in ok(home, "data", "list")] == [("cloud-file", "3"),
                                                                          ("local-folder-example", "1")]
    assert len(ok(home, "data", "list", "-n", "local-folder-example", "--include-archived")) == 2
    assert [d["version"] for d in ok(home, "data", "list", "--archived-only")] == ["2"]

    assert "'missing:1' not found" in refused(home, "data", "show", "-n", "missing", "-v", "1")
    assert "label: 'best'" in refused(home, "data", "show", "-n", "cloud-file", "-l", "best")
    (tmp_path / "bad.yml").write_text("name: x\npath: data/\nformat: csv\n")
    assert "format: unknown field" in refused(home, "data", "create", "-f", str(tmp_path / "bad.yml"))
    assert "path: " in refused(home, "data", "create", "-n", "x", "-t", "uri_file", "-p", str(tmp_path / "data"))
    assert "only local paths and azureml:// URIs" in refused(home, "data", "create", "-n", "x", "-p",
                                                            "https://example.com/a.csv")
    assert "has no MLTable file" in refused(home, "data", "create", "-n", "x", "-t", "mltable", "-p",
                                            str(tmp_path / "data"))
    assert "name: " in refused(home, "data", "create", "-n", "../up", "-p", str(tmp_path / "data"))


def test_models_of_each_type_and_a_job_output_registered_as_a_model(home: Path, tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "MLmodel").write_text("flavors: {python_function: {}}\n")
    (tmp_path / "weights.pkl").write_bytes(b"\x80\x04N.")
    (tmp_path / "model.yml").write_text("$schema: https://azuremlschemas.azureedge.net/latest/model.schema.json\n"
                                        "name: mlflow-example\npath: m\ntype: mlflow_model\ndescription: an MLflow model\n")
    mlflow = ok(home, "model", "create", "-f", str(tmp_path / "model.yml"))
    assert (mlflow["type"], mlflow["version"]) == ("mlflow_model", "1") and mlflow["id"].endswith("/models/mlflow-example/versions/1")
    custom = ok(home, "model", "create", "-n", "local-file-example", "-p", str(tmp_path / "weights.pkl"))
    assert custom["type"] == "custom_model" and custom["path"].endswith("/weights.pkl")  # a file model is a file
    assert ok(home, "model", "create", "-n", "triton", "-t", "triton_model", "-p", str(tmp_path / "m"))["version"] == "1"
    assert ok(home, "model", "show", "-n", "mlflow-example", "-l", "latest")["path"] == mlflow["path"]
    assert sorted(m["name"] for m in ok(home, "model", "list")) == ["local-file-example", "mlflow-example", "triton"]
    (tmp_path / "bert.yml").write_text("name: bert\npath: m\ntype: bert_model\n")
    assert "'bert_model' is not a model asset type" in refused(home, "model", "create", "-f", str(tmp_path / "bert.yml"))

    emu = Emulator(home)  # a finished job whose output `model` went to a datastore folder
    emu.datastores.create(DatastoreSpec("outs", "local", folder=str(tmp_path / "outs")))
    (tmp_path / "outs" / "trained").mkdir(parents=True)
    (tmp_path / "outs" / "trained" / "MLmodel").write_text("flavors: {}\n")
    spec = job_from_dict({"command": "echo", "compute": "c1", "outputs": {
        "model": {"type": "mlflow_model", "path": "azureml://datastores/outs/paths/trained"}}}, base_dir=tmp_path)
    emu.store.add_run("train_job", "exp", "c1", job_to_record(spec))
    registered = ok(home, "model", "create", "-n", "from-job", "-t", "mlflow_model",
                    "-p", "azureml://jobs/train_job/outputs/model")
    assert registered["path"] == "azureml://datastores/outs/paths/trained"
    assert registered["source"] == "azureml://jobs/train_job/outputs/model"
    assert "has no output named weights" in refused(home, "model", "create", "-n", "x",
                                                    "-p", "azureml://jobs/train_job/outputs/weights")
    assert "no job named nojob" in refused(home, "data", "create", "-n", "x", "-p", "azureml://jobs/nojob/outputs/o")


def test_job_inputs_name_assets_job_outputs_and_model_folders(home: Path, tmp_path: Path) -> None:
    """The YAML keeps the reference (az ml sends it as written); submission resolves it to the datastore
    URI of the version it names, bound as the asset is: a file, or a folder."""
    emu = Emulator(home, backend="process")
    for version, path in (("1", f"{WS}/v1/train.csv"), ("2", f"{WS}/v2/train.csv")):
        emu.assets.create(asset_from_dict("data", {"name": "titanic", "version": version, "type": "uri_file",
                                                   "path": path}, base_dir=tmp_path))
    emu.assets.create(asset_from_dict("model", {"name": "bert", "type": "mlflow_model", "path": f"{WS}/bert"},
                                      base_dir=tmp_path))
    emu.store.add_run("prep_job", "exp", "c1", job_to_record(job_from_dict(
        {"command": "echo", "compute": "c1", "outputs": {"clean": {"type": "uri_folder"}}}, base_dir=tmp_path)))
    (tmp_path / "local_model").mkdir()
    (tmp_path / "job.yml").write_text(f"""\
command: python -c 1 ${{{{inputs.pinned}}}} ${{{{inputs.latest}}}} ${{{{inputs.model}}}} ${{{{inputs.prev}}}}
compute: azureml:c1
inputs:
  pinned: {{type: uri_file, path: "azureml:titanic:1"}}
  latest: {{path: "azureml:titanic@latest", mode: download}}
  model: {{type: mlflow_model, path: "azureml:bert@latest"}}
  prev: {{type: uri_folder, path: azureml://jobs/prep_job/outputs/clean}}
  local_model: {{type: custom_model, path: local_model}}
outputs:
  trained: {{type: mlflow_model}}
  scores: {{type: custom_model, mode: upload}}
""")
    job = load_job(tmp_path / "job.yml")
    assert job.inputs["pinned"].path == "azureml:titanic:1" and job.inputs["model"].type == "uri_folder"
    assert job.inputs["local_model"].path == str(tmp_path / "local_model")  # a model folder is a folder
    assert {n: o.type for n, o in job.outputs.items()} == {"trained": "uri_folder", "scores": "uri_folder"}
    bound = emu.assets.bind(job).inputs
    assert (bound["pinned"].type, bound["pinned"].path) == ("uri_file", f"{WS}/v1/train.csv")
    assert (bound["latest"].type, bound["latest"].path, bound["latest"].mode) == (
        "uri_file", f"{WS}/v2/train.csv", DataMode.DOWNLOAD)  # the asset's type, the job's mode
    assert (bound["model"].type, bound["model"].path) == ("uri_folder", f"{WS}/bert")
    assert bound["prev"].path == f"{WS}/azureml/prep_job/clean/"  # Azure ML's default output path

    for ref, said in (("azureml:titanic:9", "versions of titanic: 1, 2"), ("azureml:nothing@latest", "no data or model "
                      "asset named nothing"), ("azureml:titanic@best", "not a label"),
                      ("azureml://jobs/prep_job/outputs/x", "its outputs: clean")):
        with pytest.raises(ConfigError, match="inputs.pinned.path") as caught:
            emu.assets.bind(load_job(tmp_path / "job.yml", [f"inputs.pinned.path={ref}"]))
        assert said in str(caught.value)
    emu.create_compute(ClusterSpec("c1", "STANDARD_D2_V2", max_nodes=1))  # `job validate` resolves them too
    problems = {f.field: f.problem for f in check_job(job, emu)}  # resolved: the data is looked for there
    assert problems["inputs.pinned.path"] == f"nothing at {WS}/v1/train.csv"
    assert problems["inputs.model.path"] == f"nothing at {WS}/bert"
    findings = check_job(load_job(tmp_path / "job.yml", ["inputs.model.path=azureml:bert:4"]), emu)
    assert any(f.field == "inputs.model.path" and "versions of bert: 1" in f.fix for f in findings)
    with pytest.raises(ConfigError, match="inputs.pinned.type: 'bert_model' is not supported"):
        load_job(tmp_path / "job.yml", ["inputs.pinned.type=bert_model"])


READ_AND_SAVE = """
import os, sys
print("read:", open(os.path.join(sys.argv[1], "rows.csv")).read().strip(), flush=True)
os.makedirs(sys.argv[2], exist_ok=True)
open(os.path.join(sys.argv[2], "MLmodel"), "w").write("flavors: {}")
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["docker"], indirect=True)  # the process backend's job: through azure-ai-ml
def test_a_job_reads_a_data_asset_and_its_model_output_is_registered(emu: Emulator, cluster, make_job,
                                                                     tmp_path: Path) -> None:
    cluster(max_nodes=1)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "rows.csv").write_text("a,b")
    emu.assets.create(asset_from_dict("data", {"name": "train", "path": str(tmp_path / "train")}, base_dir=tmp_path))
    job = make_job(READ_AND_SAVE, distribution="none", args="${{inputs.data}} ${{outputs.model}}", extra="""
inputs:
  data: {path: "azureml:train@latest"}
outputs:
  model: {type: mlflow_model}
""")
    run = emu.submit(job)
    assert run.wait(timeout=120) is RunStatus.COMPLETED, run.record.error
    assert "read: a,b" in run.logs()
    assert run.record.job["inputs"]["data"]["path"].startswith(f"{WS}/LocalUpload/")  # the version it read
    model = emu.assets.create(asset_from_dict("model", {"name": "trained", "type": "mlflow_model",
                                                        "path": f"azureml://jobs/{run.id}/outputs/model"},
                                              base_dir=tmp_path))
    assert [p.rsplit("/", 1)[-1] for p, _ in emu.datastores.ls(model["path"])] == ["MLmodel"]


def test_azure_ai_ml_registers_lists_and_gets_data_and_models_through_the_service(live, tmp_path: Path) -> None:  # noqa: F811
    """ml_client.data / ml_client.models against `amlemu serve`: a local folder uploaded by the SDK,
    versions numbered by the service, label latest, listing, the same registry as the CLI's, and a
    job whose inputs name a data asset @latest and a model by version."""
    from azure.ai.ml import Input, MLClient, command  # noqa: PLC0415
    from azure.ai.ml.constants import AssetTypes  # noqa: PLC0415
    from azure.ai.ml.entities import AmlCompute, Data, Model  # noqa: PLC0415
    from azure.core.exceptions import HttpResponseError, ResourceNotFoundError  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "a.csv").write_text("1,2\n")
    first = ml_client.data.create_or_update(Data(name="sdk-rows", path=str(tmp_path / "rows"),
                                                 type=AssetTypes.URI_FOLDER, description="rows"))
    assert first.version == "1" and first.type == "uri_folder"
    (tmp_path / "rows" / "b.csv").write_text("3,4\n")
    second = ml_client.data.create_or_update(Data(name="sdk-rows", path=str(tmp_path / "rows"),
                                                  type=AssetTypes.URI_FOLDER))
    assert second.version == "2"
    assert ml_client.data.get("sdk-rows", label="latest").version == "2"  # before the archive below
    assert ml_client.data.get("sdk-rows", version="1").description == "rows"
    assert sorted(d.version for d in ml_client.data.list(name="sdk-rows")) == ["1", "2"]
    assert [d.name for d in ml_client.data.list()] == ["sdk-rows"]
    with pytest.raises(ResourceNotFoundError):
        ml_client.data.get("sdk-rows", version="9")
    ml_client.data.archive("sdk-rows", version="2")
    assert ml_client.data.get("sdk-rows", label="latest").version == "1"
    assert [d.version for d in ml_client.data.list(name="sdk-rows")] == ["1"]

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "MLmodel").write_text("flavors: {}\n")
    model = ml_client.models.create_or_update(Model(name="sdk-model", path=str(tmp_path / "m"),
                                                    type=AssetTypes.MLFLOW_MODEL))
    assert (model.version, model.type) == ("1", "mlflow_model")
    assert ml_client.models.get("sdk-model", label="latest").version == "1"
    assert [m.name for m in ml_client.models.list()] == ["sdk-model"]

    emu = Emulator(tmp_path / "emu")  # the CLI's registry is the SDK's: the files are on the datastore
    stored = emu.assets.get("data", "sdk-rows", "2")
    assert stored["archived"] is True
    assert sorted(p.rsplit("/", 1)[-1] for p, _ in emu.datastores.ls(stored["path"])) == ["a.csv", "b.csv"]
    assert emu.assets.get("model", "sdk-model")["type"] == "mlflow_model"

    # A job naming both by reference, as the SDK sends them (their ARM ids), reads the versions named.
    ml_client.compute.begin_create_or_update(AmlCompute(name="c1", size="STANDARD_D2_V2", max_instances=1,
                                                        idle_time_before_scale_down=0)).result()
    job = ml_client.jobs.create_or_update(command(
        command="ls ${{inputs.rows}}; cat ${{inputs.model}}/MLmodel", compute="c1",
        environment="azureml://registries/azureml/environments/sklearn-1.5/labels/latest",
        inputs={"rows": Input(type="uri_folder", path="azureml:sdk-rows@latest"),
                "model": Input(type="mlflow_model", path="azureml:sdk-model:1")}))
    ml_client.jobs.stream(job.name)
    assert ml_client.jobs.get(job.name).status == "Completed"
    log = (tmp_path / "emu" / "runs" / job.name / "user_logs" / "std_log.txt").read_text()
    assert "a.csv" in log and "b.csv" not in log and "flavors: {}" in log  # @latest: version 1 (2 is archived)
    with pytest.raises(HttpResponseError, match="properties.dataUri"):  # never a path on the service's machine
        ml_client.data._operation.create_or_update(  # noqa: SLF001 - the REST call, as a caller may send it
            name="x", version="1", resource_group_name="amlemu-rg", workspace_name="amlemu-ws",
            body={"properties": {"dataType": "uri_folder", "dataUri": "/etc"}})


ECHO_MODEL = {  # an MLflow pyfunc model written by hand (mlflow's save_model looks for the network)
    "MLmodel": "flavors:\n  python_function:\n    loader_module: echo_model\n    code: code\n",
    "code/echo_model.py": "class Echo:\n    def predict(self, data, params=None):\n        return [len(data)]\n\n\n"
                          "def _load_pyfunc(path):\n    return Echo()\n",
}


def test_an_mlflow_model_on_a_ro_mount_input_is_a_folder_mlflow_loads(home: Path, tmp_path: Path) -> None:
    """mlflow.pyfunc.load_model refuses a path that resolves out of its parent folder, which the link
    of a ro_mount into the node's cache does (hello-model-as-output of Azure's examples failed so):
    a model folder reaches the job as a real folder, read from the node's cache; data stays a link."""
    import mlflow.pyfunc  # noqa: PLC0415

    from amlemu.runs.mounts import RunData, host_path  # noqa: PLC0415
    from amlemu.storage.nodecache import CachePolicy, NodeCache  # noqa: PLC0415

    emu = Emulator(home, backend="process")
    emu.datastores.create(DatastoreSpec("models", "local", folder=str(tmp_path / "store")))
    for rel, text in {**{f"echo/{k}": v for k, v in ECHO_MODEL.items()}, "rows/a.csv": "1,2\n"}.items():
        (tmp_path / "store" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "store" / rel).write_text(text)
    job = job_from_dict({"command": "echo", "compute": "c1", "inputs": {
        "model": {"type": "mlflow_model", "path": "azureml://datastores/models/paths/echo"},
        "rows": {"type": "uri_folder", "path": "azureml://datastores/models/paths/rows"}}}, base_dir=tmp_path)
    lifecycle: list[str] = []
    data = RunData(emu.datastores, job, "run_1", CachePolicy(), lifecycle.append)
    data.prepare_node("c1-node-0", tmp_path / "node", NodeCache(tmp_path / "cache"))
    model, rows = (host_path(tmp_path / "node", b.node_path) for b in data.bindings)
    assert model.is_dir() and not model.is_symlink() and rows.is_symlink()
    assert mlflow.pyfunc.load_model(str(model)).predict([1, 2, 3]) == [3]
    assert any("inputs.model: an MLflow model: copied from the node's cache" in line for line in lifecycle)
