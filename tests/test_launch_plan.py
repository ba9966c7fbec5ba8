"""One launch plan: the dry run is what runs. The supervisor builds the plan with the same pure
function from the nodes allocation gave, executes it and writes it to system_logs/launch.json;
apart from the node names and addresses allocation decided, it equals the dry run."""
from __future__ import annotations

import json

import pytest
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
