"""One launch plan: the dry run is what runs. The supervisor builds the plan with the same pure
function from the nodes allocation gave, executes it and writes it to system_logs/launch.json;
apart from the node names and addresses allocation decided, it equals the dry run."""
from __future__ import annotations

import json

import pytest
from conftest import import_base_image

from amlemu.api import Emulator
from amlemu.specs import RunStatus

pytestmark = pytest.mark.slow

PRINT = "import os\nprint('rank', os.environ.get('OMPI_COMM_WORLD_RANK'), flush=True)\n"


KEYS = ("run_id", "compute", "backend", "launch", "env", "node_env", "node_base_env", "node_slots", "ranks", "data",
        "notices")


def _bound(dry: dict, names: list[str], addresses: list[str]) -> dict:
    """The dry run with allocation's choices filled in: node i's name and address."""
    text = json.dumps({k: dry[k] for k in KEYS})
    for slot, name, address in zip(dry["node_slots"], names, addresses):
        text = text.replace(slot["address"], address).replace(slot["name"], name)
    return json.loads(text)


def test_the_dry_run_is_what_the_supervisor_launched(emu: Emulator, cluster, make_job) -> None:
    cluster()
    fs, root = emu.datastores.filesystem("workspaceblobstore")
    fs.pipe(f"{root}/plan-test/x.txt", b"x")
    job = make_job(PRINT, nodes=2, per_node=2, extra=(
        "environment_variables:\n  MY_SETTING: 'a value with spaces'\n  DATASET_MOUNT_ATTRIBUTE_CACHE_TTL: '60000'\n"
        "inputs:\n  data:\n    type: uri_folder\n    path: azureml://datastores/workspaceblobstore/paths/plan-test\n"))
    # The job names no input in its command; the binding is still made and shown.
    run = emu.submit(job)
    assert run.wait(timeout=180) is RunStatus.COMPLETED, run.record.error
    launched = json.loads((run.dir / "system_logs" / "launch.json").read_text())
    dry = emu.plan_job(job, run_id=run.id)
    addresses = [slot["address"] for slot in launched["node_slots"]]
    assert [slot["name"] for slot in launched["node_slots"]] == run.record.nodes
    assert {k: launched[k] for k in KEYS} == _bound(dry, run.record.nodes, addresses)
    launch = launched["launch"][3:] if launched["launch"][0].endswith("nsenter") else launched["launch"]
    assert launch[0].endswith("mpirun") and launched["env"]["MY_SETTING"] == "a value with spaces"
    assert launched["data"][0]["ref"] == "inputs.data"


def test_a_dry_run_creates_nothing(emu: Emulator, cluster, make_job) -> None:
    cluster()
    job = make_job(PRINT, nodes=2, extra=(
        "inputs:\n  data:\n    type: uri_folder\n    path: azureml://datastores/workspaceblobstore/paths/mnist\n"))
    before = sorted(str(p.relative_to(emu.home.root)) for p in emu.home.root.rglob("*"))
    rows = emu.store.datastores(), emu.store.runs(), emu.store.nodes("c1")
    plan = emu.plan_job(job)
    assert plan["launch"] and len(plan["nodes"]) == 2
    assert [n["shm_size"] for n in plan["nodes"]] == [2 << 30] * 2  # Azure ML's default /dev/shm: 2g
    job.write_text(job.read_text().replace("resources:\n", "resources:\n  shm_size: 64m\n"))
    assert [n["shm_size"] for n in emu.plan_job(job)["nodes"]] == [64 << 20] * 2
    assert sorted(str(p.relative_to(emu.home.root)) for p in emu.home.root.rglob("*")) == before
    assert (emu.store.datastores(), emu.store.runs(), emu.store.nodes("c1")) == rows


def _launched(run) -> dict:  # type: ignore[no-untyped-def]
    return json.loads((run.dir / "system_logs" / "launch.json").read_text())


def test_a_job_with_an_environment_launches_as_its_dry_run_showed(emu: Emulator, cluster, make_job, tmp_path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run names the environment's folder in the cache before it is built (its content
    hash), and the nodes run from it: the same PATH, node plans and notices."""
    monkeypatch.setenv("AMLEMU_ENV_CACHE", str(tmp_path / "envs"))
    monkeypatch.setenv("AMLEMU_OFFLINE", "1")  # packaging is this venv's: linked, nothing downloaded
    cluster(max_nodes=1)
    job = make_job("import packaging, sys\nprint('prefix', sys.prefix, flush=True)\n", distribution="none")
    (job.parent / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - packaging\n")
    job.write_text(job.read_text() + "environment:\n  image: amlemu-tests/absent:1\n  conda_file: conda.yml\n")
    before = emu.plan_job(job)
    prefix = before["software"]["prefix"]
    assert prefix and prefix.startswith(str(tmp_path / "envs")) and before["software"]["built"] is False
    assert "to be built as the run is prepared" in before["software"]["runs"]
    run = emu.submit(job)
    assert run.wait(timeout=180) is RunStatus.COMPLETED, run.record.error
    assert f"prefix {prefix}" in run.logs()
    dry, launched = emu.plan_job(job, run_id=run.id), _launched(run)
    assert (dry["software"]["prefix"], dry["software"]["built"]) == (prefix, True)  # the same folder, now built
    assert "(built already)" in dry["software"]["runs"]
    node = run.record.nodes[0]
    assert {k: launched[k] for k in KEYS} == _bound(dry, [node], [launched["node_slots"][0]["address"]])
    path = launched["node_base_env"][node].get("PATH") or dry["nodes"][0]["environment"]["PATH"]  # docker: container's
    assert path.startswith(f"{prefix}/bin:")


def test_a_job_whose_image_is_not_built_here_launches_as_its_dry_run_showed(emu: Emulator, cluster, make_job) -> None:
    """An image built from a context whose base image no engine here has: both say the nodes run
    this machine's software and why."""
    cluster(max_nodes=1)
    job = make_job(PRINT, distribution="none")
    (job.parent / "context").mkdir()
    (job.parent / "context" / "Dockerfile").write_text("FROM amlemu-tests/absent:1\n")
    job.write_text(job.read_text() + "environment:\n  build:\n    path: context\n")
    before = emu.plan_job(job)
    assert before["software"]["prefix"] is None and before["software"]["image"] is None
    assert "no engine here has its base image amlemu-tests/absent:1" in " ".join(before["notices"])
    run = emu.submit(job)
    assert run.wait(timeout=180) is RunStatus.COMPLETED, run.record.error
    dry, launched = emu.plan_job(job, run_id=run.id), _launched(run)
    assert {k: launched[k] for k in KEYS} == _bound(dry, run.record.nodes, [launched["node_slots"][0]["address"]])


@pytest.mark.parametrize("backend", ["docker"], indirect=True)
def test_where_the_engine_has_the_image_the_dry_run_names_the_layered_image(emu: Emulator, cluster, make_job,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's image with its environment's packages layered on: the dry run names the tag the
    run will build and its nodes run it (nothing is built by the dry run)."""
    import docker

    monkeypatch.setenv("AMLEMU_OFFLINE", "1")
    client = docker.from_env()
    base = import_base_image(client)
    try:
        cluster(max_nodes=1)
        job = make_job(PRINT, distribution="none")
        (job.parent / "conda.yml").write_text("dependencies:\n  - python=3.11\n  - pip:\n    - packaging\n")
        job.write_text(job.read_text() + f"environment:\n  image: {base}\n  conda_file: conda.yml\n")
        plan = emu.plan_job(job)
        tag = plan["software"]["image"]
        assert tag.startswith("amlemu/env:") and plan["software"]["built"] is False and not client.images.list(tag)
        assert [n["image"] for n in plan["nodes"]] == [tag] and plan["nodes"][0]["image_note"] is None
    finally:
        client.images.remove(base, force=True)


def test_a_job_submitted_from_inside_a_slurm_job_or_an_mpi_rank_still_gets_its_own_cluster(
        emu: Emulator, cluster, make_job, monkeypatch: pytest.MonkeyPatch) -> None:
    """The platform's mpirun took the submitter's MPI settings or SLURM allocation for its own ("All
    nodes which are allocated for this job are already filled": seen on a lent GPU machine, whose
    environment sets OMPI_MCA_plm=isolated; SLURM's variables do the same): the emulated cluster is
    mpirun's whole allocation, as on AmlCompute."""
    for name, value in {"SLURM_JOBID": "7", "SLURM_JOB_ID": "7", "SLURM_NODELIST": "login1", "SLURM_TASKS_PER_NODE": "1",
                        "SLURM_JOB_NUM_NODES": "1", "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0",
                        "PMIX_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    cluster()
    run = emu.submit(make_job(PRINT, nodes=2, per_node=1))
    assert run.wait(timeout=180) is RunStatus.COMPLETED, run.record.error
    assert [run.logs(rank).split() for rank in (0, 1)] == [["rank", "0"], ["rank", "1"]]
