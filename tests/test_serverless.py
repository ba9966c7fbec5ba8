"""Serverless compute and `compute: local`: a job with no compute (20 of azureml-examples'
cli/jobs/basics command jobs) runs on the home's serverless pool, sized from
resources.instance_type (Azure ML's default size when none), low priority for job_tier spot; its
nodes are made for the job and removed after it; users see `serverless`. `compute: local` runs on
this machine as one process. Pure checks first, then dry runs, then one real job per backend
(docker through the Python API and the CLI, process through azure-ai-ml and the service)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_until
from test_service import live  # noqa: F401 - the in-process service fixture

from amlemu import skus
from amlemu.api import Emulator
from amlemu.cluster import pools
from amlemu.errors import ConfigError, StateError
from amlemu.jobs import resource
from amlemu.jobs.convert import job_yaml_dict
from amlemu.jobs.jobspec_io import job_from_record, job_to_record
from amlemu.jobs.jobyaml import job_from_dict
from amlemu.service.state import jobrest
from amlemu.studio.data import StudioData
from amlemu.specs import ClusterSpec, Priority


def job(**fields: object):  # type: ignore[no-untyped-def]
    return job_from_dict({"command": "echo hello", **fields}, base_dir=Path("."))


def test_no_compute_is_serverless_on_azure_mls_default_size_and_dedicated_nodes() -> None:
    for spec in (job(), job(compute="serverless"), job(compute="azureml:serverless")):
        assert spec.compute == "serverless" and spec.instance_type is None and spec.job_tier is None
        pool = pools.pool_spec(spec, {})
        assert pool is not None and pool.vm_size == "Standard_DS3_v2" and pool.vm_priority is Priority.DEDICATED
        assert pool.min_nodes == 0 and pool.idle_seconds_before_scaledown == 0  # nodes only while a job runs
        assert pool.max_nodes == 100  # the quota: jobs do not queue behind each other
    assert pools.pool_spec(job(compute="azureml:c1"), {}) is None  # a named cluster is the user's


def test_instance_type_and_job_tier_pick_the_pool_and_survive_the_run_record() -> None:
    spot = job(resources={"instance_type": "standard_nc6", "instance_count": 2}, distribution={"type": "mpi"},
               queue_settings={"job_tier": "Spot"})
    assert (spot.instance_type, spot.job_tier) == ("Standard_NC6", "spot")  # Azure's spelling, any case
    pool = pools.pool_spec(spot, {"AMLEMU_MAX_INSTANCES": "8"})
    assert pool is not None and pool.name == "serverless-standard-nc6-spot" and pool.max_nodes == 8
    assert pool.vm_priority is Priority.LOW_PRIORITY and pool.size.gpus == 1
    for tier in ("basic", "standard", "premium"):  # every other tier: dedicated nodes
        spec = pools.pool_spec(job(queue_settings={"job_tier": tier}), {})
        assert spec is not None and spec.vm_priority is Priority.DEDICATED
    assert job_from_record(job_to_record(spot)) == spot
    # `amlemu convert`'s YAML and the azure-ai-ml command() the azureml target sends keep them too.
    from amlemu.jobs import sdk2  # noqa: PLC0415

    for spec in (spot, job(), job(compute="local")):
        written = job_yaml_dict(spec)
        assert ("compute" in written) is (spec.compute != "serverless")
        assert job_from_dict(written, base_dir=Path(".")) == spec
        assert job_from_dict(sdk2.job_dict(sdk2.command_from_spec(spec)), base_dir=Path(".")) == spec


@pytest.mark.parametrize(("fields", "message"), [
    ({"resources": {"instance_type": "Standard_X9"}}, "resources.instance_type: unknown size 'Standard_X9'; use one of: "),
    ({"queue_settings": {"job_tier": "gold"}},
     "queue_settings.job_tier: 'gold' is not a job tier; use one of: spot, basic, standard, premium"),
    ({"queue_settings": {"tier": "spot"}}, "queue_settings.tier: unknown field"),
    ({"compute": "local", "resources": {"instance_count": 2}, "distribution": {"type": "mpi"}},
     "compute: a local job runs as one process on this machine"),
    ({"compute": "local", "distribution": {"type": "pytorch", "process_count_per_instance": 2}},
     "compute: a local job runs as one process on this machine"),
    ({"compute": ["c1"]}, "compute: ['c1'] is not a compute name"),
])
def test_bad_serverless_and_local_settings_are_one_line_naming_the_field(fields: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        job(**fields)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_pool_names_cannot_be_users_computes_and_users_see_serverless() -> None:
    names = [skus.serverless_pool(s.name, t) for s in skus.VM_SIZES.values() for t in ("spot", None)]
    assert all(skus.is_pool(n) and len(n) > 24 for n in [*names, skus.LOCAL_POOL])  # no AmlCompute name is > 24
    for name in (names[0], skus.LOCAL_POOL):
        with pytest.raises(ConfigError, match="is the name of amlemu's"):
            pools.check_user_compute(ClusterSpec(name))
    with pytest.raises(ConfigError, match="size: Local is the size of `compute: local` only"):
        pools.check_user_compute(ClusterSpec("c1", vm_size="Local"))
    with pytest.raises(ConfigError, match="is not a valid compute name"):
        ClusterSpec("serverless-but/not-a-pool-name")
    assert [skus.shown_compute(n) for n in (names[0], skus.LOCAL_POOL, "c1")] == ["serverless", "local", "c1"]
    assert [skus.rest_compute(n) for n in (names[0], skus.LOCAL_POOL, "c1")] == [None, "local", "c1"]


def test_the_rest_body_of_a_command_without_compute_is_serverless_with_its_size_and_tier() -> None:
    from azure.ai.ml import command  # noqa: PLC0415
    from azure.ai.ml.entities import JobResourceConfiguration, QueueSettings  # noqa: PLC0415

    from amlemu.jobs import sdk2  # noqa: PLC0415

    node = command(command="echo hi", environment="python:3.11-slim",
                   resources=JobResourceConfiguration(instance_type="Standard_D2_v2"),
                   queue_settings=QueueSettings(job_tier="spot"))
    spec = job_from_dict(sdk2.job_dict(node), base_dir=Path("."))  # the Python API's path
    assert (spec.compute, spec.instance_type, spec.job_tier) == ("serverless", "Standard_D2_v2", "spot")
    data = jobrest.to_yaml("j1", sdk2.rest_body(node), lambda n, v: Path("/never"), lambda env: env)
    spec = job_from_dict(data, base_dir=Path("."))  # the service's path
    assert (spec.compute, spec.instance_type, spec.job_tier) == ("serverless", "Standard_D2_v2", "spot")
    props = resource.command_properties("j1", job_to_record(spec), workspace_id="/ws", compute=None,
                                        experiment="e", status="Queued", output_uris={})
    assert "computeId" not in props and props["queueSettings"] == {"jobTier": "Spot"}
    az = resource.az_job({"id": "/ws/jobs/j1", "name": "j1", "properties": props})
    assert "compute" not in az and az["queue_settings"] == {"job_tier": "spot"}
    assert az["resources"]["instance_type"] == "Standard_D2_v2"


def test_dry_runs_show_the_pool_and_make_nothing(tmp_path: Path) -> None:
    emu = Emulator(tmp_path / "home", backend="process")
    (tmp_path / "job.yml").write_text("command: echo hi\nresources:\n  instance_type: Standard_D2_v2\n"
                                      "queue_settings:\n  job_tier: spot\n")
    plan = emu.plan_job(str(tmp_path / "job.yml"))
    assert plan["pool"] == {"compute": "serverless", "name": "serverless-standard-d2-v2-spot",
                            "vm_size": "Standard_D2_v2", "vm_priority": "lowpriority", "backend": "process",
                            "made": "at submit", "nodes": "made for the job, removed when it ends"}
    assert [p["node"] for p in plan["processes"]] == ["serverless-standard-d2-v2-spot-node-0"]
    (tmp_path / "local.yml").write_text("command: echo hi\ncompute: local\n")
    plan = emu.plan_job(str(tmp_path / "local.yml"))
    assert plan["pool"]["compute"] == "local" and plan["pool"]["vm_size"] == "Local"
    assert not any("Local scaled" in n for n in plan.get("notices", []))  # this machine's own size
    assert emu.computes() == [] and emu.runs() == []
    with pytest.raises(ConfigError, match="is the name of amlemu's serverless pool"):
        emu.plan_compute(ClusterSpec("serverless-standard-d2-v2-spot"))
    # Once made, a spot pool takes `compute preempt` as a low-priority AmlCompute does; a dedicated one refuses it.
    for tier in ("spot", "standard"):
        pool = pools.pool_spec(job(resources={"instance_type": "Standard_D2_v2"}, queue_settings={"job_tier": tier}), {})
        assert pool is not None
        emu.store.add_cluster(pool, "process")  # the record alone: no node is up, nothing to remove
    assert emu.faults.plan_preempt("serverless-standard-d2-v2-spot") == []
    with pytest.raises(StateError, match="is dedicated: only low-priority nodes are preempted"):
        emu.faults.plan_preempt("serverless-standard-d2-v2-dedicated")
    assert emu.plan_job(str(tmp_path / "job.yml"))["pool"]["made"] == "already"


@pytest.mark.parametrize("backend", ["docker"])
def test_a_serverless_spot_job_runs_on_nodes_made_for_it_and_shows_serverless(emu: Emulator, tmp_path: Path) -> None:
    (tmp_path / "job.yml").write_text("command: echo hello-serverless\nexperiment_name: sls\n"
                                      "resources:\n  instance_type: Standard_D2_v2\n"
                                      "queue_settings:\n  job_tier: spot\n")
    run = emu.submit(str(tmp_path / "job.yml"))
    assert run.wait(timeout=300).value == "Completed", run.logs(0)
    assert "hello-serverless" in run.logs(0)
    pool = emu.compute("serverless-standard-d2-v2-spot")
    assert pool.spec.vm_priority is Priority.LOW_PRIORITY and pool.backend == "docker"
    assert run.record.cluster == pool.spec.name
    wait_until(lambda: emu.store.nodes(pool.spec.name) == [], 60, "the job's node to be removed after it")
    exe = str(Path(sys.executable).with_name("amlemu"))
    shown = subprocess.run([exe, "--home", str(emu.home.root), "job", "show", run.id], capture_output=True,
                           text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert f"{run.id} (sls) on serverless: Completed" in shown.stdout, shown.stdout + shown.stderr
    studio = StudioData(emu.home)
    try:
        assert studio.job(run.id)["compute"] == "serverless"  # the studio page's job view
    finally:
        studio.close()


def test_azure_ai_ml_submits_a_command_without_compute_to_serverless(live, tmp_path: Path) -> None:  # noqa: F811
    from azure.ai.ml import MLClient, command  # noqa: PLC0415
    from azure.ai.ml.entities import JobResourceConfiguration, QueueSettings  # noqa: PLC0415
    from azure.identity import DefaultAzureCredential  # noqa: PLC0415

    ml_client = MLClient(DefaultAzureCredential(), "00000000-0000-0000-0000-000000000000", "amlemu-rg", "amlemu-ws")
    job = ml_client.jobs.create_or_update(command(
        command="echo hello-sdk-serverless", experiment_name="sls",
        environment="azureml://registries/azureml/environments/sklearn-1.5/labels/latest",
        resources=JobResourceConfiguration(instance_type="Standard_D2_v2"), queue_settings=QueueSettings(job_tier="spot")))
    ml_client.jobs.stream(job.name)
    got = ml_client.jobs.get(job.name)
    assert got.status == "Completed" and got.compute is None  # serverless: no compute, as Azure ML reports it
    assert got.resources.instance_type == "Standard_D2_v2" and got.queue_settings.job_tier.lower() == "spot"
    emu = Emulator(tmp_path / "emu")
    assert emu.store.run(job.name).cluster == "serverless-standard-d2-v2-spot"
    assert emu.compute("serverless-standard-d2-v2-spot").spec.vm_priority is Priority.LOW_PRIORITY
    assert [c.name for c in ml_client.compute.list()] == []  # the pool is no compute of the workspace, as on Azure
