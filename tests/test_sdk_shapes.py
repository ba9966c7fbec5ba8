"""The shape of Azure's own basic examples (cli/jobs/basics of Azure/azureml-examples), submitted
with azure-ai-ml's `load_job` through `amlemu serve`: a YAML with no compute (serverless), no
code, the registry environment most examples name, and inputs naming a data asset and an MLflow
model `@latest` that the SDK itself registered; `ml_client.jobs.get` gives what scripts query.

Covered elsewhere, not repeated here: `command()` without compute (tests/test_serverless.py),
without code (tests/test_no_code.py), with a data asset @latest on a named cluster
(tests/test_assets.py), and the Job resource equal to `amlemu job show`'s, services included
(tests/test_job_resource.py). The examples' run-job.sh through the CLI: bench/examples_yardstick.sh."""
from __future__ import annotations

from pathlib import Path

from test_service import WS, live  # noqa: F401 - the in-process service fixture

EXAMPLE_SHAPE = """\
$schema: https://azuremlschemas.azureedge.net/latest/commandJob.schema.json
command: |
  ls ${{inputs.sampledata}}
  test -d ${{inputs.model}} && test ! -L ${{inputs.model}} && echo "model: a folder"
inputs:
  sampledata:
    type: uri_folder
    path: azureml:shape-data@latest
    mode: ro_mount
  model:
    type: mlflow_model
    path: azureml:shape-model@latest
environment: azureml://registries/azureml/environments/sklearn-1.5/labels/latest
"""


def test_an_example_shaped_yaml_through_load_job_runs_serverless_and_reads_its_assets(live, tmp_path: Path) -> None:  # noqa: F811
    from azure.ai.ml import MLClient, load_job  # noqa: PLC0415
    from azure.ai.ml.constants import AssetTypes  # noqa: PLC0415
    from azure.ai.ml.entities import Data, Model  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    url, _, _ = live
    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    (tmp_path / "example-data").mkdir()
    (tmp_path / "example-data" / "iris.csv").write_text("sepal_length,species\n5.1,setosa\n")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "MLmodel").write_text("flavors: {}\n")
    ml_client.data.create_or_update(Data(name="shape-data", path=str(tmp_path / "example-data"),
                                         type=AssetTypes.URI_FOLDER))
    ml_client.models.create_or_update(Model(name="shape-model", path=str(tmp_path / "model"),
                                            type=AssetTypes.MLFLOW_MODEL))
    (tmp_path / "hello-shape.yml").write_text(EXAMPLE_SHAPE)

    job = ml_client.jobs.create_or_update(load_job(str(tmp_path / "hello-shape.yml")))
    ml_client.jobs.stream(job.name)
    got = ml_client.jobs.get(job.name)  # what run-job.sh queries: status, services.Studio.endpoint
    assert got.status == "Completed" and got.compute is None  # serverless: no compute, as Azure ML shows it
    studio = got.services["Studio"].endpoint  # azure-ai-ml appends the tenant to what the service sends
    assert studio == f"{url}/studio/jobs/{job.name}?wsid={WS}&tid=00000000-0000-0000-0000-000000000000"
    assert got.environment == "azureml://registries/azureml/environments/sklearn-1.5/labels/latest"
    log = (tmp_path / "emu" / "runs" / job.name / "user_logs" / "std_log.txt").read_text()
    assert "iris.csv" in log and "model: a folder" in log  # an MLflow model on ro_mount: a real folder
