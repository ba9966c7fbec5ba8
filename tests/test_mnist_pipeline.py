"""The example examples/mnist_pipeline/: the seed's MNIST as prepare -> train (2 nodes, Horovod, the
seed's trainer/train.py) -> evaluate. `make test`: its steps as they would run, the dry run, the
prepare script; `make test-full`: the real run on part of MNIST reaching 90% through the pytest
plugin's aml_pipeline helper."""
from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import FULL, REPO, TRAINING

from amlemu.api import Emulator
from amlemu.cli import cli
from amlemu.pipelines import submit as pipelines
from amlemu.pipelines.pipelinespec import load_pipeline
from pytest_amlemu.pipelines import PipelineRunner
from pytest_amlemu.plugin import JobRunner

EXAMPLE = REPO / "examples" / "mnist_pipeline"


def _prepare_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("mnist_prepare", EXAMPLE / "src" / "prepare.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_the_steps_run_the_seeds_trainer_on_two_nodes_between_prepare_and_evaluate() -> None:
    spec = load_pipeline(EXAMPLE / "pipeline.yml")
    children = {s: pipelines.child_name("p", s) for s in spec.steps}
    train = pipelines.step_job(spec, "train", "p", children)
    assert train.instance_count == 2 and train.distribution.type == "mpi"
    assert Path(train.code or "").resolve() == REPO / "trainer"  # trainer/train.py, unchanged
    assert train.inputs["data"].path == "azureml://datastores/workspaceblobstore/paths/azureml/p_prepare/prepared/"
    assert train.outputs["model"].path == "azureml://datastores/workspaceblobstore/paths/azureml/p_train/model/"
    assert "--max-steps" not in train.command and train.command.endswith("&& cp model.py ${{outputs.model}}/")
    evaluate = pipelines.step_job(spec, "evaluate", "p", children)
    assert evaluate.instance_count == 1 and {i.path for i in (evaluate.inputs["model"], evaluate.inputs["data"])} == \
        {train.outputs["model"].path, train.inputs["data"].path}
    assert spec.bound_outputs() == {"model": ("train", "model"), "metrics": ("evaluate", "metrics")}
    fewer = load_pipeline(EXAMPLE / "pipeline.yml", ["inputs.train_images=1000"])
    assert pipelines.step_job(fewer, "prepare", "p", children).inputs["train_images"] == 1000


@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_the_dry_run_on_the_seeds_cluster_lists_the_steps_in_run_order_and_validate_names_what_is_missing(emu: Emulator, tmp_path: Path) -> None:
    env = {"AMLEMU_HOME": str(emu.home.root)}
    made = CliRunner().invoke(cli, ["compute", "create", "-f", str(REPO / "trainer" / "compute.yml"), "--backend",
                                    "process"], env=env)
    assert made.exit_code == 0, made.output
    planned = CliRunner().invoke(cli, ["job", "create", "-f", str(EXAMPLE / "pipeline.yml"), "--dry-run", "-o", "json"],
                                 env=env)
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert plan["run_order"] == ["prepare", "train", "evaluate"]
    assert [(s["step"], sorted(s["after"]), s["compute"]) for s in plan["steps"]] == [
        ("prepare", [], "gpucluster"), ("train", ["prepare"], "gpucluster"), ("evaluate", ["prepare", "train"], "gpucluster")]
    assert emu.runs() == []  # a dry run makes nothing
    # job validate checks each step as the job it runs: here only MNIST is missing (not yet published);
    # what prepare and train will write is not looked for
    checked = CliRunner().invoke(cli, ["job", "validate", "-f", str(EXAMPLE / "pipeline.yml"), "-o", "json"], env=env)
    assert checked.exit_code == 1
    assert [(f["field"], f["problem"]) for f in json.loads(checked.output)] == [
        ("jobs.prepare.inputs.raw.path", "nothing at azureml://datastores/workspaceblobstore/paths/mnist")]


def _idx(magic: int, shape: tuple[int, ...], items: bytes) -> bytes:
    return struct.pack(f">I{len(shape)}I", magic, *shape) + items


def test_prepare_writes_the_first_images_of_each_split_and_refuses_what_is_not_mnist(tmp_path: Path) -> None:
    prepare = _prepare_module()
    raw = tmp_path / "in" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for prefix, count in (("train", 5), ("t10k", 3)):
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(_idx(0x803, (count, 2, 2), bytes(range(4 * count))))
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(_idx(0x801, (count,), bytes([7, 1, 7, 2, 0][:count])))
    assert prepare.main(["--raw", str(tmp_path / "in"), "--train-images", "3", "--test-images", "2",
                         "--out", str(tmp_path / "out")]) == 0
    out = tmp_path / "out" / "MNIST" / "raw"
    assert (out / "train-images-idx3-ubyte").read_bytes() == _idx(0x803, (3, 2, 2), bytes(range(12)))
    assert (out / "t10k-labels-idx1-ubyte").read_bytes() == _idx(0x801, (2,), bytes([7, 1]))
    summary = json.loads((tmp_path / "out" / "prepared.json").read_text())
    assert summary["train"] == {"images": 3, "per_label": {"1": 1, "7": 2}}
    with pytest.raises(prepare.DataError, match="t10k images: 4 items asked, it has 3"):
        prepare.prepare(raw, tmp_path / "more", {"train": 1, "test": 4})
    (raw / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x09abc")
    with pytest.raises(prepare.DataError, match="t10k labels: 11 bytes, its header says 17"):
        prepare.prepare(raw, tmp_path / "bad", {"train": 1, "test": 1})
    assert prepare.main(["--raw", str(tmp_path), "--out", str(tmp_path / "none")]) == 2


@TRAINING
@FULL
@pytest.mark.parametrize("backend", ["process"], indirect=True)
def test_the_pipeline_trains_on_two_nodes_and_its_evaluate_step_reaches_90_percent(
        emu: Emulator, cluster, mnist_root: Path, tmp_path: Path) -> None:
    """20,000 training images, 2 epochs (~0.93-0.95; 10,000 reached 0.90), scored on 2,000 test
    images by the evaluate step, through the plugin's aml_pipeline helper."""
    emu.datastores.upload(mnist_root, "azureml://datastores/workspaceblobstore/paths/mnist")
    runner = PipelineRunner(JobRunner(emu, lambda **_: cluster(), {"timeout": 900}, tmp_path))
    result = runner(EXAMPLE / "pipeline.yml", ["inputs.train_images=20000", "inputs.test_images=2000"])
    prepared = json.loads((result.steps["prepare"].outputs["prepared"] / "prepared.json").read_text())
    assert prepared["train"]["images"] == 20000 and prepared["test"]["images"] == 2000
    assert len(result.steps["train"].run.record.nodes) == 2  # type: ignore[union-attr]
    assert "parameters identical on all 2 ranks: True" in result.steps["train"].logs()
    assert {"model.pt", "model.py"} <= {p.name for p in result.outputs["model"].iterdir()}
    metrics = json.loads((result.outputs["metrics"] / "metrics.json").read_text())
    assert metrics["images"] == 2000 and metrics["accuracy"] >= 0.9, metrics
    assert result.steps["evaluate"].run.metrics()["test_accuracy"] == pytest.approx(metrics["accuracy"])  # type: ignore[union-attr]
